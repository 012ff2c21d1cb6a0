"""Token alignment of stored rows (docs/alignment.md)."""

import numpy as np
import pytest
from hallulog.workers.capture import CaptureError, load_capture, select_rows
from safetensors.numpy import save_file

P, R, L, H = 5, 4, 3, 2


def _hidden(num_tokens):
    # value = position, so rows can be checked by their token position
    pos = np.arange(num_tokens, dtype=np.float32)[:, None, None]
    return np.broadcast_to(pos, (num_tokens, L, H)).copy()


@pytest.mark.parametrize("num_tokens", [P + R - 1, P + R])
@pytest.mark.parametrize(
    "mode,first,prompt_rows",
    [("all", 0, P), ("prompt", 0, P), ("response", P - 1, 1), ("last", None, 0)],
)
def test_rows_follow_the_alignment_convention(num_tokens, mode, first, prompt_rows):
    rows = select_rows(
        _hidden(num_tokens),
        prompt_len=P,
        response_len=R,
        sequence_mode=mode,
        layer_index=None,
        dtype="float16",
    )
    assert rows.acts.shape[0] == L and rows.acts.dtype == np.float16
    positions = rows.acts[0, :, 0].astype(int).tolist()
    start = num_tokens - 1 if first is None else first
    assert positions[0] == rows.row0_position == start
    assert positions == list(range(start, start + len(positions)))
    if mode == "prompt":
        assert len(positions) == P
    if mode in ("all", "response", "last"):
        assert positions[-1] == num_tokens - 1
    assert rows.prompt_rows == prompt_rows
    assert rows.prompt_rows + rows.response_rows == len(positions)


def test_wrong_token_count_is_refused():
    with pytest.raises(CaptureError):
        select_rows(
            _hidden(P + R + 3),
            prompt_len=P,
            response_len=R,
            sequence_mode="all",
            layer_index=None,
            dtype="float32",
        )


def test_load_capture_checks_token_ids_and_deletes(tmp_path):
    path = tmp_path / "x.safetensors"
    save_file(
        {"hidden_states": _hidden(3), "token_ids": np.array([1, 2, 3], dtype=np.int64)}, str(path)
    )
    assert load_capture(str(path), [1, 2, 3]).shape == (3, L, H)
    assert not path.exists()
    save_file(
        {"hidden_states": _hidden(3), "token_ids": np.array([1, 2, 4], dtype=np.int64)}, str(path)
    )
    with pytest.raises(CaptureError, match="token ids differ"):
        load_capture(str(path), [1, 2, 3])
    path.write_bytes(b"\x10\x00\x00")
    with pytest.raises(CaptureError, match="unreadable"):
        load_capture(str(path), [1])


@pytest.mark.parametrize("layer_index", [None, [0, 2, 5], [-1]])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("tokens", [3, 300])  # 300 x 6 x 600: the torch cast path
def test_transpose_cast_is_numpys_cast_bit_for_bit(layer_index, dtype, tokens):
    from hallulog.workers.capture import TORCH_CAST_MIN, transpose_cast

    rng = np.random.default_rng(tokens)
    bits = rng.integers(0, 2**32, (tokens, 6, 600), dtype=np.uint64).astype(np.uint32)
    hidden = bits.view(np.float32).copy()
    hidden[np.isnan(hidden)] = np.float32(np.nan)  # a signalling NaN is quieted by torch only
    hidden[1, -1, :4] = [np.inf, -np.inf, 65520.0, 2.0**-25]  # overflow / rounding edges
    rows = hidden[1:]
    want = rows if layer_index is None else rows[:, layer_index, :]
    with np.errstate(over="ignore"):
        want = np.ascontiguousarray(np.transpose(want, (1, 0, 2)).astype(dtype))
        got = transpose_cast(rows, layer_index, dtype)
    assert got.flags.c_contiguous and got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()
    if tokens == 300 and dtype == "float16" and layer_index is None:
        assert got.size >= TORCH_CAST_MIN


@pytest.mark.parametrize("layer_index", [None, [0, 2, 5]])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("tokens", [3, 300])  # 300 x 6 x 600: the torch cast path
def test_bfloat16_captures_cast_as_ml_dtypes_does_bit_for_bit(layer_index, dtype, tokens):
    """vLLM writes a bf16 model's hidden states as BF16: they are mapped as ml_dtypes'
    bfloat16 and cast once, by torch for large casts, exactly as numpy's ml_dtypes cast."""
    import ml_dtypes
    from hallulog.workers.capture import TORCH_CAST_MIN, transpose_cast

    rng = np.random.default_rng(tokens)
    bits = rng.integers(0, 2**16, (tokens, 6, 600), dtype=np.uint64).astype(np.uint16)
    hidden = bits.view(ml_dtypes.bfloat16).copy()
    nan = np.isnan(hidden.astype(np.float32))
    hidden[nan] = ml_dtypes.bfloat16(np.nan)  # NaN payloads: only "is NaN" is kept
    hidden[-1, 0, :4] = [np.inf, 70000.0, 65520.0, 2.0**-25]  # float16 overflow / rounding
    rows = hidden[1:] if tokens > 3 else hidden
    rows.flags.writeable = False  # as a mapped capture file is
    with np.errstate(over="ignore"):
        want = rows if layer_index is None else rows[:, layer_index, :]
        want = np.ascontiguousarray(np.transpose(want, (1, 0, 2)).astype(dtype))
        got = transpose_cast(rows, layer_index, dtype)
    assert got.dtype == want.dtype and got.shape == want.shape and got.flags.c_contiguous
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert got[~np.isnan(got)].tobytes() == want[~np.isnan(want)].tobytes()
    if tokens == 300:
        assert got.size >= TORCH_CAST_MIN


def test_load_capture_reads_every_dtype_the_servers_write(tmp_path):
    import torch
    from safetensors.torch import save_file as save_torch

    hidden = torch.arange(24, dtype=torch.float32).reshape(4, 3, 2) / 8
    ids = [5, 6, 7, 8]
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        path = tmp_path / f"{dtype}.safetensors"
        save_torch({"hidden_states": hidden.to(dtype), "token_ids": torch.tensor(ids)}, str(path))
        got = load_capture(str(path), ids)
        assert got.shape == (4, 3, 2) and np.array_equal(got.astype(np.float32), hidden.numpy())
        assert not path.exists()


def test_a_truncated_capture_file_is_unreadable(tmp_path):
    path = tmp_path / "x.safetensors"
    save_file(
        {"hidden_states": _hidden(3), "token_ids": np.array([1, 2, 3], dtype=np.int64)}, str(path)
    )
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(CaptureError, match="unreadable.*truncated"):
        load_capture(str(path), [1, 2, 3])


def test_the_reader_waits_for_the_writers_lock_then_reads(tmp_path):
    """The spool protocol (docs/vllm.md): the server answers before its file is written and
    holds flock(LOCK_EX) on PATH.lock until the file is complete. Written in place here, as
    upstream's connector does (no rename): only the lock tells the reader it is not done."""
    import fcntl
    import os
    import threading
    import time

    path = str(tmp_path / "hs-1.safetensors")
    lock = os.open(path + ".lock", os.O_CREAT | os.O_WRONLY, 0o644)
    fcntl.flock(lock, fcntl.LOCK_EX)

    save_file(
        {"hidden_states": np.ones((3, 2, 4), np.float32), "token_ids": np.array([5, 6, 7])},
        str(tmp_path / "whole"),
    )
    data = (tmp_path / "whole").read_bytes()
    os.unlink(tmp_path / "whole")

    def write_late() -> None:
        with open(path, "wb") as f:
            f.write(data[:20])  # the file exists, half written
            f.flush()
            time.sleep(0.3)
            f.write(data[20:])
        os.close(lock)

    writer = threading.Thread(target=write_late)
    start = time.monotonic()
    writer.start()
    hidden = load_capture(path, [5, 6, 7])
    writer.join()
    assert time.monotonic() - start >= 0.25 and hidden.shape == (3, 2, 4)
    assert os.listdir(tmp_path) == []  # the file and its lock are deleted after reading


def test_a_capture_that_never_comes_times_out(tmp_path):
    with pytest.raises(CaptureError, match="not written within"):
        load_capture(str(tmp_path / "never.safetensors"), [1], timeout=0.1)


@pytest.mark.parametrize("in_order", [True, False])
def test_bfloat16_cast_with_and_without_in_order_copies(monkeypatch, in_order):
    """The bf16 cast reuses one small scratch per layer where ``_foreach_copy_`` copies in list
    order (probed), and widens every layer of a block at once where it might not: same bits."""
    import hallulog.workers.capture as capture
    import ml_dtypes

    assert capture._foreach_copies_in_order()  # torch on CPU: a loop of copy_, in order
    monkeypatch.setattr(capture, "_in_order", in_order)
    rng = np.random.default_rng(7)
    hidden = rng.standard_normal((500, 9, 700), dtype=np.float32).astype(ml_dtypes.bfloat16)
    got = capture.transpose_cast(hidden, [8, 0, 3, 4], "float16")
    want = np.ascontiguousarray(hidden[:, [8, 0, 3, 4]].transpose(1, 0, 2).astype(np.float16))
    assert got.tobytes() == want.tobytes()

"""The worker's capture check: a capture whose rows are all zeros, non-finite or repeated
across different tokens is a capture failure with its reason (errors.jsonl ``reason``, the done
event's ``capture_reasons``), the generation kept without activations; ``check_captures`` off
stores the rows as they come. Real capture files, the real worker and store; the backend client
is a small stand-in that writes them."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import numpy as np
import pytest
from hallulog.contracts import layout
from hallulog.contracts.jsonl import iter_rows
from hallulog.contracts.prompt_group import PromptGroup
from hallulog.workers.capture import select_rows
from hallulog.workers.capture_check import CaptureRowsError, capture_reasons, check_captured
from hallulog.workers.client import Completion
from hallulog.workers.errors import error_record
from hallulog.workers.positions import select_positions
from hallulog.workers.worker import GroupWorker, WorkerSpec
from safetensors.numpy import save_file

from hallulog import storage

LAYERS = (0, 1, 2)
HIDDEN = 8
PROMPT, RESPONSE = [11, 12, 13, 14], [21, 22, 23, 24, 25]
#: sample id → what the stand-in backend does to its capture
PLANTS = {1: "zeros", 2: "nan0", 3: "constant"}


class PlantingBackend:
    """Writes a real capture file per request (every position, float32); the samples of
    :data:`PLANTS` get a bad one."""

    def __init__(self, spool: Path) -> None:
        self.spool = spool
        spool.mkdir(parents=True, exist_ok=True)

    async def chat(self, messages, *, temperature, top_p, max_tokens, seed, capture, capture_rows):
        sample = seed % 10  # the test's seeds: see _spec
        captured = PROMPT + RESPONSE[:-1]
        hidden = (
            np.random.default_rng(seed)
            .standard_normal((len(captured), len(LAYERS), HIDDEN))
            .astype(np.float32)
        )
        plant = PLANTS.get(sample)
        if plant == "zeros":
            hidden[:] = 0.0
        elif plant == "nan0":
            hidden[:, :, 0] = np.nan
        elif plant == "constant":
            hidden[:] = hidden[:1]
        path = self.spool / f"{uuid.uuid4().hex}.safetensors"
        save_file({"hidden_states": hidden, "token_ids": np.array(captured, np.int64)}, str(path))
        return Completion(
            text="x",
            finish_reason="stop",
            prompt_token_ids=list(PROMPT),
            token_ids=list(RESPONSE),
            logprobs=[],
            usage={},
            hidden_states_path=str(path),
            elapsed_ms=1,
        )

    async def close(self) -> None:
        pass


def _run(tmp_path: Path, check: bool) -> tuple[dict, Path]:
    spec = WorkerSpec(
        worker_id=0,
        server_url="http://127.0.0.1:1",
        model_name="m",
        worker_dir=str(layout.worker_dir(tmp_path, 0)),
        storage_format="packed",
        layer_ids=LAYERS,
        hidden_size=HIDDEN,
        sequence_mode="response",
        dtype="float16",
        capture_mode="generation",
        k_samples=3,
        primary_temperature=0.0,
        sample_temperature=0.7,
        sample_top_p=0.95,
        max_tokens=8,
        seed=0,
        groups_in_flight=1,
        request_timeout=5.0,
        check_captures=check,
    )
    group = PromptGroup.create("qa", "test", 0, [{"role": "user", "content": "q"}], reference=None)
    events: list[dict] = []

    class Channel:
        def send(self, event: dict) -> None:
            events.append(event)

    async def main() -> None:
        worker = GroupWorker(spec, Channel())  # type: ignore[arg-type]
        await worker.client.close()
        worker.client = PlantingBackend(tmp_path / "spool")  # type: ignore[assignment]
        worker._request_params = lambda pid, sid: dict(  # type: ignore[method-assign]
            temperature=0.0, top_p=1.0, max_tokens=8, seed=100 + sid
        )
        try:
            await worker._process(group)
        finally:
            worker._loading.shutdown(wait=True)
            worker.committer.close()
            worker.out.close()

    asyncio.run(main())
    (event,) = events
    return event, layout.worker_dir(tmp_path, 0)


def test_bad_captures_fail_with_their_reason(tmp_path):
    event, wdir = _run(tmp_path, check=True)
    assert event["event"] == "done" and event["capture_errors"] == 3
    assert event["capture_reasons"] == {
        "capture_zeros": 1,
        "capture_nonfinite": 1,
        "capture_constant": 1,
    }
    errors = {e["sample_id"]: e for e in iter_rows(wdir / layout.ERRORS)}
    assert {sid: e["reason"] for sid, e in errors.items()} == {
        1: "capture_zeros",
        2: "capture_nonfinite",
        3: "capture_constant",
    }
    assert all(e["error_type"] == "capture_failed" for e in errors.values())
    assert "CaptureRowsError: capture_nonfinite: 15 row(s)" in errors[2]["error_message"]
    gens = {g["sample_id"]: g for g in iter_rows(wdir / layout.GENERATIONS)}
    assert [gens[s]["activation_key"] is None for s in range(4)] == [False, True, True, True]
    assert [r["sample_id"] for r in iter_rows(wdir / layout.ACTIVATION_INDEX)] == [0]


def test_check_off_stores_the_rows_as_they_come(tmp_path):
    event, wdir = _run(tmp_path, check=False)
    assert event["capture_errors"] == 0 and event["capture_reasons"] == {}
    assert not list(iter_rows(wdir / layout.ERRORS))
    reader = storage.open_store(wdir)
    nan_key = next(
        r["activation_key"]
        for r in iter_rows(wdir / layout.ACTIVATION_INDEX)
        if r["sample_id"] == 2
    )
    stored = reader.read_sample(reader.index_of(nan_key))
    assert np.isnan(stored[:, :, 0]).all() and np.isfinite(stored[:, :, 1:]).all()


def _capture(rows: int) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((rows, len(LAYERS), HIDDEN)).astype(np.float32)


def test_check_captured_reads_the_ids_at_the_rows_positions():
    ids = PROMPT + RESPONSE[:-1]  # generation capture: 8 positions
    hidden = _capture(len(ids))
    hidden[5] = hidden[4]  # positions 4 and 5: response tokens 21, 22
    rows = select_rows(
        hidden,
        prompt_len=4,
        response_len=5,
        sequence_mode="response",
        layer_index=None,
        dtype="float16",
    )
    assert rows.row0_position == 3
    with pytest.raises(CaptureRowsError, match="capture_constant: 2 row") as caught:
        check_captured(rows, token_ids=ids, layer_ids=LAYERS)
    assert caught.value.reason == "capture_constant"
    same = list(ids)
    same[5] = same[4]  # the same token twice: a repeated row is no fault
    check_captured(rows, token_ids=same, layer_ids=LAYERS)
    named = select_positions(
        hidden,
        prompt_len=4,
        response_len=5,
        capture_mode="generation",
        names=("tbg", "last"),
        exact_answer_span=None,
        layer_index=None,
        dtype="float16",
    )
    check_captured(named, token_ids=ids, layer_ids=LAYERS)  # rows at positions 3 and 7
    hidden[7] = hidden[3]
    named = select_positions(
        hidden,
        prompt_len=4,
        response_len=5,
        capture_mode="generation",
        names=("tbg", "last"),
        exact_answer_span=None,
        layer_index=None,
        dtype="float16",
    )
    with pytest.raises(CaptureRowsError, match="capture_constant"):
        check_captured(named, token_ids=ids, layer_ids=LAYERS)


def test_error_rows_carry_the_reason():
    exc = CaptureRowsError.__new__(CaptureRowsError)
    try:
        hidden = _capture(8)
        hidden[:, 1] = 0.0
        check_captured(
            select_rows(
                hidden,
                prompt_len=4,
                response_len=5,
                sequence_mode="all",
                layer_index=None,
                dtype="float32",
            ),
            token_ids=PROMPT + RESPONSE[:-1],
            layer_ids=LAYERS,
        )
    except CaptureRowsError as raised:
        exc = raised
    row = error_record(exc, "p", 1, "capture_failed", worker_id=0, server_url="u")
    assert row["reason"] == "capture_zeros" and row["error_type"] == "capture_failed"
    assert "reason" not in error_record(
        RuntimeError("x"), "p", 1, "capture_failed", worker_id=0, server_url="u"
    )
    assert capture_reasons([row, row, {"error_type": "capture_failed"}]) == {"capture_zeros": 2}

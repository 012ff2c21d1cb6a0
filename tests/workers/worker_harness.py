"""Run the real worker (``hallulog.workers.worker.GroupWorker``) on one prompt group in-process and return
the events it sent the driver: the shared harness of the worker tests against a live backend."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
from hallulog.contracts import layout
from hallulog.contracts.jsonl import iter_rows
from hallulog.contracts.prompt_group import PromptGroup
from hallulog.workers.worker import GroupWorker, WorkerSpec

from hallulog import storage


def process_group(
    spec: WorkerSpec,
    group: PromptGroup,
    *,
    capture_rows: str | None = None,
    model_dtype_capture: bool = False,
) -> list[dict]:
    """Process ``group`` with a worker built from ``spec``; its events, in order.
    ``capture_rows``: what the worker's capture requests ask for, in place of its own choice
    (``all``: every position, as a server that ignores the field writes);
    ``model_dtype_capture``: its requests ask for no capture dtype (files in the model dtype,
    as a server that ignores the field writes them)."""
    events: list[dict] = []

    class Channel:
        def send(self, event: dict) -> None:
            events.append(event)

    async def main() -> None:
        worker = GroupWorker(spec, Channel())  # type: ignore[arg-type]
        if capture_rows is not None:
            worker.capture_rows = capture_rows
        if model_dtype_capture:
            worker.client.capture_dtype = None
        try:
            await worker._process(group)
        finally:
            await worker.client.close()
            worker._loading.shutdown(wait=True)
            worker.committer.close()
            worker.out.close()

    asyncio.run(main())
    return events


#: activation index fields that are the same whatever the capture file held
INDEX_FIELDS = (
    "activation_key",
    "layers",
    "sequence_mode",
    "capture_mode",
    "prompt_token_count",
    "response_token_count",
    "row0_position",
    "num_rows",
    "prompt_rows",
    "response_rows",
    "positions",
    "token_positions",
    "exact_answer_span",
)


def stored_activations(
    spec: WorkerSpec,
    group: PromptGroup,
    *,
    capture_rows: str | None = None,
    model_dtype_capture: bool = False,
) -> dict[str, tuple[dict, list[np.ndarray]]]:
    """Run ``group`` (:func:`process_group`) into ``spec.worker_dir``; per activation key, its
    index fields (:data:`INDEX_FIELDS`) and the stored rows of every layer."""
    events = process_group(
        spec, group, capture_rows=capture_rows, model_dtype_capture=model_dtype_capture
    )
    assert [e["event"] for e in events] == ["done"], events
    assert events[0]["capture_errors"] == 0, events
    wdir = Path(spec.worker_dir)
    reader = storage.open_store(wdir)
    try:
        out = {}
        for row in iter_rows(wdir / layout.ACTIVATION_INDEX):
            i = reader.index_of(row["activation_key"])
            layers = [np.array(reader.read(i, j)) for j in range(len(spec.layer_ids))]
            out[row["activation_key"]] = ({k: row.get(k) for k in INDEX_FIELDS}, layers)
        return out
    finally:
        reader.close()

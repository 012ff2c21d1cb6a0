"""A run stored in bfloat16 consolidates and validates clean, in every storage format (npy files
hold the words as ``<u2`` under ``"dtype": "bfloat16"`` index lines: docs/formats/npy.md)."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hallulog.contracts import layout
from hallulog.contracts.ids import activation_key
from hallulog.postrun.consolidate import consolidate
from hallulog.postrun.validate import validate
from hallulog.storage import open_store
from hallulog.workers.persist import GenerationRecord, WorkerDir

from tests.postrun.postrun_fixtures import (
    ANSWER_TOKENS,
    HIDDEN,
    LAYERS,
    generation_row,
    prompt_ids,
    prompt_row,
    write_manifest_for,
)


@pytest.mark.parametrize("fmt", ["npy", "packed", "zarr"])
def test_bfloat16_run_validates(tmp_path: Path, fmt: str):
    pids = prompt_ids(4)
    write_manifest_for(tmp_path, k=1, fmt=fmt, workers=1, prompts=4)
    out = WorkerDir(
        tmp_path / "worker_0",
        worker_id=0,
        storage_format=fmt,
        layer_ids=LAYERS,
        hidden_size=HIDDEN,
        dtype="bfloat16",
    )
    for i, pid in enumerate(pids):
        acts = np.full((len(LAYERS), 2, HIDDEN), i + 0.5, np.float32).astype(ml_dtypes.bfloat16)
        records = []
        for sid in range(2):
            row = generation_row(pid, sid, i % 2)
            row["worker_id"] = 0
            records.append(
                GenerationRecord(
                    row=row,
                    acts=acts,
                    prompt_rows=1,
                    response_rows=1,
                    label=i % 2,
                    activation_row={
                        "prompt_id": pid,
                        "sample_id": sid,
                        "activation_key": activation_key(pid, sid),
                        "layers": LAYERS,
                        "sequence_mode": "response",
                        "capture_mode": "generation",
                        "prompt_token_count": 20,
                        "response_token_count": ANSWER_TOKENS,
                        "row0_position": 19,
                        "num_rows": 2,
                        "prompt_rows": 1,
                        "response_rows": 1,
                    },
                )
            )
        prow = prompt_row(i, pid, i % 2, "2026-01-01T00:00:00")
        prow.update(worker_id=0, num_generations=2)
        out.persist_group(prow, records)
    out.close()
    consolidate(tmp_path)
    report = validate(tmp_path, expected_prompt_ids=set(pids))
    assert report["ok"], report["problems"]
    r = open_store(layout.consolidated_dir(tmp_path))
    assert (
        r.dtype == np.dtype(ml_dtypes.bfloat16)
        and float(r.read(r.index_of(activation_key(pids[3], 1)), 0)[0, 0]) == 3.5
    )

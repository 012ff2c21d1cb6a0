"""Validation fails, naming the cause, when too many generations lack activations (a
foreign server on the port made every capture fail, yet the run said 'validation OK')."""

from __future__ import annotations

import json
from pathlib import Path

from hallulog.contracts import layout
from hallulog.postrun.validate import MAX_MISSING_ACTIVATION_SHARE, validate


def _write(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _root(tmp_path: Path, n: int, with_acts: int) -> Path:
    root = tmp_path / "run"
    root.mkdir()
    (root / "run_manifest.json").write_text(json.dumps({"k_samples": 0, "storage_format": "npy"}))
    out = layout.consolidated_dir(root)
    pids = [f"{i:016x}" for i in range(n)]
    _write(
        out / layout.PROMPT_INDEX,
        [{"prompt_id": p, "dataset_id": p, "prompt": "q?", "label": 0, "meta": {}} for p in pids],
    )
    _write(
        out / layout.GENERATIONS,
        [
            {
                "prompt_id": p,
                "sample_id": 0,
                "role": "primary",
                "text": "a",
                "finish_reason": None,
                "usage": {},
                "logprobs": [],
                "token_ids": [1],
                "request_params": {},
                "generation_time_ms": 1,
            }
            for p in pids
        ],
    )
    _write(out / layout.ACTIVATION_INDEX, [])
    _write(
        root / "worker_0" / layout.ERRORS,
        [
            {
                "timestamp": "t",
                "error_type": "capture_failed",
                "prompt_id": p,
                "sample_id": 0,
                "stack_trace": "",
                "error_message": "CaptureError: backend returned no kv_transfer_params",
            }
            for p in pids[with_acts:]
        ],
    )
    return root


def test_most_activations_missing_fails_validation_naming_the_cause(tmp_path):
    report = validate(_root(tmp_path, 10, 0))
    assert not report["ok"]
    assert report["problem_counts"].get("activations_missing") == 1
    problem = next(p for p in report["problems"] if p["class"] == "activations_missing")
    text = json.dumps(problem)
    assert "10 of 10" in text and "no kv_transfer_params" in text
    assert "activations_missing" in report["repair"]


def test_share_is_documented():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    assert f"{MAX_MISSING_ACTIVATION_SHARE:.0%}" in doc

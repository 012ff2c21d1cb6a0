"""hallulog.api.client: fetch_status over HTTP, status_from_artifacts from a run's files, format_status."""

from __future__ import annotations

import json

import pytest
from hallulog.api import (
    StatusError,
    StatusServer,
    fetch_status,
    format_status,
    status_from_artifacts,
)

from tests.api.status_fixtures import make_board


def test_fetch_status_and_format(clock):
    board = make_board(clock)
    board.set_phase("running")
    board.group_started(0, "p0")
    clock.advance(2)
    board.group_done(0, "p0", generations=3, tokens=64)
    board.server_update("http://127.0.0.1:8001", health="ok", restarts=0, in_flight=1)
    board.group_failed(1, "p1", {"error_type": "ReadTimeout", "error_message": "slow\nbackend"})
    with StatusServer(board.snapshot, token="tok") as srv:
        with pytest.raises(StatusError, match="401.*--token"):
            fetch_status(srv.url)
        snap = fetch_status(srv.url + "/", token="tok")
        assert fetch_status(srv.url + "/status", token="tok")["run_id"] == "run-1"
    text = format_status(snap)
    assert "run run-1  phase running" in text
    assert "5/20 (25.0%)" in text  # 4 skipped + 1 done
    assert "done 1  failed 1" in text
    assert "http://127.0.0.1:8001  ok" in text
    assert "ReadTimeout: slow backend" in text


def test_fetch_status_unreachable():
    with pytest.raises(StatusError, match="cannot reach"):
        fetch_status("http://127.0.0.1:9", timeout_s=1)


def _write_jsonl(path, rows, torn=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path.write_text(text + (torn or ""))


@pytest.fixture
def artifacts(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    (root / "run_manifest.json").write_text(
        json.dumps(
            {
                "run_id": "8c1f",
                "model": "smollm2-135m",
                "dataset": "triviaqa",
                "split": "dev",
                "k_samples": 2,
                "logging_profile": "integrated",
                "config_fingerprint": "cd" * 32,
                "timestamp": "2026-01-01T00:00:00Z",
                "total_prompts": 6,
                "artifact_root": str(root),
            }
        )
    )
    (root / "completed_prompts.json").write_text(json.dumps({"completed": ["a", "b", "c", "d"]}))
    _write_jsonl(root / "worker_0" / "prompt_index.jsonl", [{"prompt_id": p} for p in "ab"])
    _write_jsonl(
        root / "worker_0" / "generations.jsonl",
        [{"prompt_id": p, "sample_id": s} for p in "ab" for s in range(3)],
    )
    _write_jsonl(
        root / "worker_1" / "prompt_index.jsonl",
        [{"prompt_id": p} for p in "cd"],
        torn='{"prompt_id": "e", "lab',
    )  # a crash mid-append: not counted
    _write_jsonl(
        root / "worker_1" / "generations.jsonl",
        [{"prompt_id": p, "sample_id": s} for p in "cd" for s in range(3)],
    )
    _write_jsonl(
        root / "worker_1" / "errors.jsonl",
        [
            {
                "timestamp": "2026-01-01T00:01:00Z",
                "error_type": "CaptureFailed",
                "prompt_id": "c",
                "sample_id": 1,
                "error_message": "spool file missing",
                "stack_trace": "...",
            },
            {
                "timestamp": "2026-01-01T00:02:00Z",
                "error_type": "ServerError",
                "prompt_id": "f",
                "sample_id": 0,
                "error_message": "500",
                "stack_trace": "...",
            },
        ],
        torn='{"timest',
    )
    return root


def test_status_from_artifacts(artifacts):
    s = status_from_artifacts(artifacts)
    json.dumps(s)
    assert s["source"] == "artifacts" and s["run_id"] == "8c1f"
    assert s["fingerprint"] == "cd" * 32
    assert s["config"]["model"] == "smollm2-135m" and s["config"]["k_samples"] == 2
    # "c" had a capture error but completed; only "f" failed.
    assert s["prompts"] == {
        "total": 6,
        "done": 4,
        "failed": 1,
        "in_flight": 0,
        "skipped": 0,
        "remaining": 1,
    }
    assert s["generations"] == 12
    assert [(w["id"], w["done"], w["errors"]) for w in s["workers"]] == [(0, 2, 0), (1, 2, 2)]
    assert [e["prompt_id"] for e in s["errors"]] == ["c", "f"]
    assert all("stack_trace" not in e for e in s["errors"])
    assert s["phase"] == "stopped"
    text = format_status(s)
    assert "(from artifacts)" in text and "4/6" in text and "ServerError: 500" in text

    (artifacts / "consolidated").mkdir()
    (artifacts / "consolidated" / "validation_report.json").write_text("{}")
    assert status_from_artifacts(artifacts)["phase"] == "done"


def test_status_from_artifacts_bad_line_names_file_and_line(artifacts):
    path = artifacts / "worker_0" / "errors.jsonl"
    path.write_text('{"error_type": "E"}\nnot json\n{"error_type": "F"}\n')
    with pytest.raises(StatusError, match=r"worker_0/errors\.jsonl: line 2"):
        status_from_artifacts(artifacts)


def test_status_from_artifacts_missing_dir(tmp_path):
    with pytest.raises(StatusError, match="no such artifact directory"):
        status_from_artifacts(tmp_path / "nope")

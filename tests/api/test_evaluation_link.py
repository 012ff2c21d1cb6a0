"""The evaluation report is linked where a person looks: the live snapshot and dashboard, the
status from artifacts, and the run's closing summary."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient
from hallulog.api import format_status, status_from_artifacts
from hallulog.api.app import create_app
from hallulog.cli.commands import format_result
from hallulog.orchestrator.run import RunResult

from tests.api.status_fixtures import make_board


def _report(root: Path) -> Path:
    path = root / "evaluation" / "report.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# Hallucination detectors: evaluation report\n")
    return path


def test_live_snapshot_and_dashboard_link_the_report(clock, tmp_path):
    board = make_board(clock)
    client = TestClient(create_app(board.snapshot, None))
    assert client.get("/status").json()["evaluation_report"] is None
    board.set_evaluation_report(_report(tmp_path))
    assert client.get("/status").json()["evaluation_report"] == str(
        tmp_path / "evaluation" / "report.md"
    )
    page = client.get("/").text  # the footer shows the field when it is set
    assert 'id="evaluation-report"' in page and "s.evaluation_report" in page
    board.set_evaluation_report(None)
    assert client.get("/status").json()["evaluation_report"] is None


def test_status_from_artifacts_prints_the_report(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    (root / "run_manifest.json").write_text(json.dumps({"run_id": "r1", "total_prompts": 0}))
    assert status_from_artifacts(root)["evaluation_report"] is None
    assert "evaluation report" not in format_status(status_from_artifacts(root))
    path = _report(root)
    snap = status_from_artifacts(root)
    assert snap["evaluation_report"] == str(path)
    assert f"evaluation report {path}" in format_status(snap)


def test_closing_summary_links_the_report(tmp_path):
    result = RunResult(
        artifact_root=tmp_path,
        total=2,
        done_before=0,
        done=2,
        labels={"correct": 1, "hallucinated": 1},
    )
    assert "evaluation report" not in format_result(result)
    path = _report(tmp_path)
    assert f"evaluation report: {path}" in format_result(result)

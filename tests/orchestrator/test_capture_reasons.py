"""Captures that failed the row check are counted per reason in the progress bar and the
closing summary (the total of capture failures unchanged)."""

from __future__ import annotations

from hallulog.cli.commands import format_result
from hallulog.orchestrator.run.loop import RunResult
from hallulog.orchestrator.run.progress import Progress, describe_capture_failures


def test_progress_counts_reasons():
    progress = Progress(3, enabled=False)
    progress.advance(generations=6, tokens=60, capture_errors=1)
    progress.advance(
        generations=6, tokens=60, capture_errors=2, capture_reasons={"capture_zeros": 2}
    )
    progress.advance(
        generations=6, tokens=60, capture_errors=1, capture_reasons={"capture_nonfinite": 1}
    )
    assert progress.capture_errors == 4
    assert progress.capture_reasons == {"capture_zeros": 2, "capture_nonfinite": 1}
    assert describe_capture_failures(progress.capture_errors, progress.capture_reasons) == (
        "4 (1 capture_nonfinite, 2 capture_zeros)"
    )
    progress.close()


def test_summary_names_the_reasons(tmp_path):
    clean = RunResult(tmp_path, total=2, done_before=0, done=2, capture_errors=1)
    assert "0 failed, 1 capture(s) failed" in format_result(clean)
    bad = RunResult(
        tmp_path,
        total=2,
        done_before=0,
        done=2,
        capture_errors=3,
        capture_reasons={"capture_constant": 1, "capture_zeros": 2},
    )
    assert "3 (1 capture_constant, 2 capture_zeros) capture(s) failed" in format_result(bad)

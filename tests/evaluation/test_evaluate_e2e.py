"""``evaluate`` and ``validate --deep`` on a real small run of the embedded SmolLM2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.e2e.conftest import REPO, run_orchestrator

pytestmark = pytest.mark.e2e


def test_evaluate_and_deep_audit_on_a_real_run(tmp_path):
    root = tmp_path / "run"
    proc = run_orchestrator(root, "--limit", "12", "--k-samples", "2", "--max-tokens", "24")
    assert proc.returncode == 0, proc.stderr[-4000:]
    t0 = time.monotonic()
    ev = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "evaluate",
            "--artifact-root",
            str(root),
            "--bootstrap",
            "200",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(os.environ),
        timeout=600,
    )
    took = time.monotonic() - t0
    report = json.loads((root / "evaluation" / "report.json").read_text())
    labels = report["labels"]
    if ev.returncode != 0:  # a 12-prompt sample can be all correct or all wrong
        assert "AUROC needs both classes" in ev.stderr, ev.stderr
        return
    assert "logprob_mean" in report["methods"] and "got_logistic_last" in report["methods"]
    assert report["per_layer"]["got_logistic_last"]["layer_ids"][0] == 0
    assert labels["correct"] + labels["hallucinated"] + labels["unlabeled"] == 12
    assert took < 300, took
    audit = subprocess.run(
        [sys.executable, "-m", "orchestrator", "validate", "--artifact-root", str(root), "--deep"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(os.environ),
        timeout=600,
    )
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr[-3000:]
    result = json.loads((root / "consolidated" / "alignment_audit.json").read_text())
    assert result["ok"] and result["mode"] == "embedding" and result["checked"] == 12 * 3
    assert result["max_rel_error"] == 0.0  # layer-0 rows are the embedding rows, bit for bit

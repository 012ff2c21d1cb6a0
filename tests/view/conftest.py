"""Fixtures of the explorer's tests: a run written with pyarrow in the consolidated schemas
(fast lane; bench/view_run.py) and, for the e2e and browser tests, a real small run of the
real model with its evaluation."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.view_run import write_view_run

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def synthetic_run(tmp_path_factory) -> Path:
    """300 prompts, K = 3, eight detectors, 5 % unlabelled."""
    return write_view_run(tmp_path_factory.mktemp("view") / "run", 300, k=3, tokens=6)


@pytest.fixture(scope="session")
def synthetic_study(tmp_path_factory) -> Path:
    """Two synthetic runs as the cells of a study (tests/view/study_root.py); the transfer
    "AUROC" of a pair is the method's AUROC on the test cell (hallulog's ``auroc``)."""
    from hallulog.contracts import layout
    from hallulog.evaluation.protocol import auroc
    from hallulog.evaluation.scores import read_scores

    from tests.view.study_root import make_study

    base = tmp_path_factory.mktemp("study")
    a = write_view_run(base / "runs" / "a", 120, k=2, tokens=4, seed=1)
    b = write_view_run(base / "runs" / "b", 90, k=2, tokens=4, seed=2)
    cells = {"k2 seed1": (a, {"seed": 1, "k": 2}), "k2/seed2": (b, {"seed": 2, "k": 2})}
    roots = {name: root for name, (root, _) in cells.items()}

    def on_test_cell(method: str, train: str, test: str) -> float:
        t = read_scores(layout.evaluation_dir(roots[test]) / layout.SCORES)
        return auroc(t.labels, t.scores[method])

    return make_study(base / "study", cells, on_test_cell, ["got_logistic_last"])


@pytest.fixture
def unevaluated_run(synthetic_run, tmp_path) -> Path:
    """The synthetic run without its evaluation/ directory."""
    root = tmp_path / "run"
    shutil.copytree(synthetic_run, root, ignore=shutil.ignore_patterns("evaluation"))
    return root


def real_run(root: Path, *args: str) -> Path:
    """``python -m orchestrator run`` (embedded SmolLM2) then ``hallulog evaluate``."""
    from tests.e2e.conftest import run_orchestrator

    proc = run_orchestrator(root, *args)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ev = subprocess.run(
        [sys.executable, "-m", "orchestrator", "evaluate", "--artifact-root", str(root)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=900,
    )
    assert ev.returncode == 0, ev.stderr[-4000:]
    return root


@pytest.fixture(scope="session")
def small_real_run(tmp_path_factory) -> Path:
    """6 TriviaQA prompts, K = 2, 16 tokens, evaluated."""
    root = tmp_path_factory.mktemp("view-real") / "run"
    return real_run(root, "--limit", "6", "--k-samples", "2", "--max-tokens", "16")

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

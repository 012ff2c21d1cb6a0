"""``hallulog study run`` on the real SmolLM2 model: two cells (two prompts of TriviaQA), the
study process SIGKILLed while the second cell runs; the same command again skips the done cell
(its files untouched) and resumes the killed one through the run's own resume, exactly once;
``compare --evaluate`` over the study then reports the cell's own AUROC."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hallulog.cli.study_status import cell_state
from hallulog.evaluation.scores import read_scores
from sklearn.metrics import roc_auc_score

from tests.e2e.conftest import REPO, free_port_block, worker_rows

pytestmark = pytest.mark.e2e

LIMIT, K = 6, 2
STUDY = """\
limit = {limit}
max_tokens = 8
k_samples = {k}
progress = false
checkpoint_every = 1
groups_in_flight = 1
server_base_port = {port}

[axes]
prompts = [{{name = "plain"}}, {{name = "terse", system_prompt = "Answer in a few words."}}]
"""


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _committed(root: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in root.glob("worker_*/prompt_index.jsonl"))


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _run_id(root: Path) -> str:
    return json.loads((root / "run_manifest.json").read_text())["run_id"]


def test_study_survives_a_sigkill_mid_cell(tmp_path: Path):
    # One group in flight: the cell commits its prompts one by one, so the kill lands mid-cell
    # on a fast machine too (the embedded default of 32 commits all six at once).
    spec = tmp_path / "study.toml"
    spec.write_text(STUDY.format(limit=LIMIT, k=K, port=free_port_block(1)))
    study = tmp_path / "S"
    plain, terse = study / "cells" / "plain", study / "cells" / "terse"
    cmd = [sys.executable, "-m", "orchestrator", "study", "run", str(spec), "--root", str(study)]
    log = (tmp_path / "first.log").open("w")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_for(
            lambda: _committed(terse) >= 1 or proc.poll() is not None,
            900,
            "a committed prompt in the second cell",
        )
        assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    # the cell's run dies with the study (PDEATHSIG), releasing its root
    _wait_for(lambda: cell_state(terse) != "running", 60, "the killed cell's run to go")
    assert cell_state(plain) == "done" and cell_state(terse) == "failed"
    before = _committed(terse)
    assert 1 <= before < LIMIT
    done_files, plain_id, terse_id = _files(plain), _run_id(plain), _run_id(terse)

    status = subprocess.run(
        [sys.executable, "-m", "orchestrator", "study", "status", str(study), "--json"],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    assert [(e["cell"], e["state"]) for e in json.loads(status.stdout)] == [
        ("plain", "done"),
        ("terse", "failed"),
    ]

    rerun = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=900)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-3000:]
    assert "[1/2] plain: done before, skipped" in rerun.stdout
    assert f"{LIMIT}/{LIMIT} prompts done ({LIMIT - before} this session, {before} before)" in (
        rerun.stdout + rerun.stderr
    )
    # the done cell was not redone: not one file of it changed or appeared
    assert _files(plain) == done_files and _run_id(plain) == plain_id
    # the killed cell was resumed (same run), every prompt exactly K + 1 generations
    assert _run_id(terse) == terse_id
    gens = worker_rows(terse, "generations.jsonl")
    keys = [(g["prompt_id"], g["sample_id"]) for g in gens]
    assert len(keys) == len(set(keys)) == LIMIT * (K + 1)
    per_prompt: dict[str, int] = {}
    for pid, _ in keys:
        per_prompt[pid] = per_prompt.get(pid, 0) + 1
    assert len(per_prompt) == LIMIT and set(per_prompt.values()) == {K + 1}
    report = json.loads((terse / "consolidated" / "validation_report.json").read_text())
    assert report["ok"], report["problem_counts"]
    manifest = json.loads((study / "study.json").read_text())
    for cell in manifest["cells"]:
        run = json.loads((study / cell["root"] / "run_manifest.json").read_text())
        assert cell["fingerprint"] == run["config_fingerprint"]
    assert [cell_state(plain), cell_state(terse)] == ["done", "done"]

    # compare over the study (each cell evaluated first): the table's AUROC is the cell's own
    cmp = subprocess.run(
        [
            sys.executable, "-m", "orchestrator", "compare", str(study), "--evaluate",
            "--no-embeddings", "--methods", "logprob", "--no-transfer", "--no-plots",
        ],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )  # fmt: skip
    assert cmp.returncode == 0, cmp.stdout + cmp.stderr[-3000:]
    table = pq.read_table(study / "compare" / "table.parquet").to_pylist()
    row = next(r for r in table if r["cell"] == "plain" and r["method"] == "logprob_min")
    scores = read_scores(plain / "evaluation" / "scores.parquet")
    y, s = scores.labels[scores.test], scores.scores["logprob_min"][scores.test]
    ok = np.isfinite(s)
    assert row["auroc"] == pytest.approx(roc_auc_score(y[ok], s[ok]), abs=1e-12)

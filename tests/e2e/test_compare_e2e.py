"""``hallulog compare`` over a study of real runs: the real SmolLM2 model on the bundled TriviaQA
(two prompts: the task's and a terse system prompt, so two cells share their prompts), NQ-Open
and SciQ samples, profile ``probes``, each evaluated by ``hallulog evaluate``; the study root is
assembled by the fixture (study.json written with the study room's own writer)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hallulog.evaluation.scores import read_scores, summarize_method
from hallulog.study import make_cell, write_study
from sklearn.metrics import roc_auc_score

from tests.e2e.conftest import REPO, free_port_block

pytestmark = pytest.mark.e2e

TERSE = "Answer with as few words as possible."
#: cell axis values -> the run's flags
CELLS = [
    ({"task": {"task": "triviaqa"}, "prompt": {"name": "plain"}}, ["--limit", "12"]),
    (
        {"task": {"task": "triviaqa"}, "prompt": {"name": "terse", "system_prompt": TERSE}},
        ["--limit", "12", "--system-prompt", TERSE],
    ),
    ({"task": {"task": "nq_open"}, "prompt": {"name": "plain"}}, ["--task", "nq_open"]),
    ({"task": {"task": "sciq"}, "prompt": {"name": "plain"}}, ["--task", "sciq"]),
]
PROBES_LAYERS = (15, 20)
NAMES = ["triviaqa__plain", "triviaqa__terse", "nq_open__plain", "sciq__plain"]


def _cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="session")
def real_study(tmp_path_factory) -> Path:
    """STUDY/cells/<name>/: four real runs on one embedded server, each evaluated; study.json."""
    from hallulog.backends.servers import wait_healthy
    from hallulog.serving.model_loader import default_model_dir

    study = tmp_path_factory.mktemp("real_study")
    port = free_port_block(1)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hallulog.serving",
            "--model",
            str(default_model_dir()),
            "--port",
            str(port),
            "--spool-dir",
            str(study / "spool"),
            "--capture-layers",  # what the probes profile stores of SmolLM2's 30 layers
            ",".join(map(str, PROBES_LAYERS)),
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    cells = []
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, 300, process=server)
        for values, flags in CELLS:
            cell = make_cell(values)
            root = cell.path(study)
            _cli(
                "run",
                "--artifact-root",
                str(root),
                "--manage-servers",
                "false",
                "--server-urls",
                url,
                "--model",
                str(default_model_dir()),
                "--progress",
                "false",
                "--k-samples",
                "2",
                "--max-tokens",
                "16",
                "--logging-profile",
                "probes",
                *flags,
            )
            manifest = json.loads((root / "run_manifest.json").read_text())
            assert tuple(manifest["layer_ids"]) == PROBES_LAYERS
            report = json.loads((root / "consolidated" / "validation_report.json").read_text())
            assert report["ok"], report.get("problem_counts")
            cells.append(make_cell(values, fingerprint=manifest["config_fingerprint"]))
    finally:
        server.terminate()
        server.wait(timeout=60)
    for cell in cells:
        _cli("evaluate", "--artifact-root", str(cell.path(study)), "--no-embeddings", "--no-plots")
    write_study(study, cells)
    return study


@pytest.fixture(scope="session")
def compared_study(real_study) -> Path:
    proc = _cli("compare", str(real_study))
    assert "4 of 4 cells compared" in proc.stdout, proc.stdout + proc.stderr
    return real_study / "compare"


def test_cell_names_and_the_manifest(real_study):
    doc = json.loads((real_study / "study.json").read_text())
    assert [c["name"] for c in doc["cells"]] == NAMES
    assert doc["axes"] == ["task", "prompt"]
    assert all(len(c["fingerprint"]) == 64 for c in doc["cells"])


def test_the_table_holds_each_cells_own_figures(real_study, compared_study):
    table = pq.read_table(compared_study / "table.parquet").to_pylist()
    assert {r["cell"] for r in table} == set(NAMES)
    for name in NAMES:
        scores = read_scores(real_study / "cells" / name / "evaluation" / "scores.parquet")
        report = json.loads(
            (real_study / "cells" / name / "evaluation" / "report.json").read_text()
        )
        rows = {r["method"]: r for r in table if r["cell"] == name}
        assert set(rows) == set(scores.scores) and "got_logistic_last" in rows
        for method in ("logprob_min", "got_logistic_last", "sep_tbg"):
            y, s = scores.labels[scores.test], scores.scores[method][scores.test]
            ok = np.isfinite(s)
            assert rows[method]["auroc"] == pytest.approx(roc_auc_score(y[ok], s[ok]), abs=1e-12)
            mine = summarize_method(
                y, s, probability=method in scores.probability, n_boot=scores.n_boot, seed=0
            )
            assert [rows[method]["auroc_lo"], rows[method]["auroc_hi"]] == mine["ci95"]
            assert rows[method]["prr"] == mine["metrics"]["prr"]
            assert rows[method]["auroc"] == report["methods"][method]["auroc"]


def test_paired_rows_only_for_the_cells_sharing_prompts(compared_study):
    paired = pq.read_table(compared_study / "paired.parquet").to_pylist()
    assert {(r["cell_a"], r["cell_b"]) for r in paired} == {("triviaqa__plain", "triviaqa__terse")}
    row = next(r for r in paired if r["method"] == "logprob_min")
    assert row["n"] == 12 and np.isfinite(row["auroc_diff"])
    assert row["auroc_diff_lo"] <= row["auroc_diff"] <= row["auroc_diff_hi"]


def test_transfer_matrices_over_one_models_cells(real_study, compared_study, tmp_path):
    rows = pq.read_table(compared_study / "transfer.parquet").to_pylist()
    table = {
        (r["cell"], r["method"]): r
        for r in pq.read_table(compared_study / "table.parquet").to_pylist()
    }
    probes = {r["method"] for r in rows}
    assert {"got_logistic_last", "lkm_exact_answer", "sep_tbg", "saplma_last"} <= probes
    for probe in probes:
        matrix = {(r["train_cell"], r["test_cell"]): r for r in rows if r["method"] == probe}
        assert set(matrix) == {(a, b) for a in NAMES for b in NAMES}  # one model: 4 x 4
        for name in NAMES:
            diagonal, own = matrix[(name, name)], table[(name, probe)]
            assert diagonal["in_domain"] and diagonal["n"] == own["n"]
            assert (
                diagonal["auroc"] == own["auroc"]
                or np.isnan([diagonal["auroc"], own["auroc"]]).all()
            )
    # an off-diagonal entry is evaluate --train-root's figure
    cells = real_study / "cells"
    _cli(
        "evaluate",
        "--train-root",
        str(cells / "triviaqa__plain"),
        "--test-root",
        str(cells / "nq_open__plain"),
        "--out",
        str(tmp_path / "t"),
        "--methods",
        "geometry",
        "--no-embeddings",
        "--no-plots",
    )
    want = json.loads((tmp_path / "t" / "report.json").read_text())["methods"]["got_logistic_last"]
    got = next(
        r
        for r in rows
        if r["method"] == "got_logistic_last"
        and (r["train_cell"], r["test_cell"]) == ("triviaqa__plain", "nq_open__plain")
    )
    assert got["auroc"] == pytest.approx(want["auroc"], abs=1e-12)
    assert [got["layer"]] == want["selected_layers"]


def test_report_and_heatmaps(compared_study):
    report = (compared_study / "report.md").read_text()
    for name in NAMES:
        assert f"| {name} |" in report
    for png in ("auroc.png", "prr.png", "transfer_got_logistic_last.png"):
        assert (compared_study / png).read_bytes()[:4] == b"\x89PNG"


def test_the_view_exports_the_compared_study(real_study, compared_study, tmp_path):
    """``hallulog view STUDY --export``: the study page from compare's own files, every cell's
    run pages beside it."""
    out = tmp_path / "site"
    proc = _cli("view", str(real_study), "--export", str(out), "--export-limit", "4")
    assert f"({len(NAMES)} cells," in proc.stdout, proc.stdout + proc.stderr
    html = (out / "index.html").read_text()
    row = next(
        r
        for r in pq.read_table(compared_study / "table.parquet").to_pylist()
        if r["cell"] == "sciq__plain" and r["method"] == "logprob_min"
    )
    assert f"{row['auroc']:.3f}" in html and "transfer_got_logistic_last.png" in html
    for name in NAMES:
        assert (out / "cells" / name / "index.html").is_file()
    assert (out / "compare" / "auroc.png").read_bytes()[:4] == b"\x89PNG"

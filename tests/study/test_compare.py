"""``compare`` over a synthetic study: the table equals each cell's own evaluation, paired rows
only for cells sharing prompts, transfer matrices only within one model's cells."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from hallulog.evaluation.evaluate import evaluate
from hallulog.evaluation.metrics import paired_differences
from hallulog.evaluation.scores import read_scores
from sklearn.metrics import roc_auc_score

from tests.study.conftest import BOOT

EVALUATED = ["synthetic__seed0", "synthetic__seed1", "synthetic-3l__seed0"]


def _cell_scores(study, name):
    return read_scores(study / "cells" / name / "evaluation" / "scores.parquet")


def test_table_rows_are_each_cells_own_figures(synthetic_study, compared):
    table = pq.read_table(compared.out / "table.parquet").to_pylist()
    assert {r["cell"] for r in table} == set(EVALUATED)
    for name in EVALUATED:
        s = _cell_scores(synthetic_study, name)
        report = json.loads(
            (synthetic_study / "cells" / name / "evaluation" / "report.json").read_text()
        )
        rows = {r["method"]: r for r in table if r["cell"] == name}
        assert set(rows) == set(s.scores) and "leaked" not in rows  # guards are no detectors
        for m in ("logprob_min", "got_logistic_last"):
            v, ok = s.scores[m][s.test], np.isfinite(s.scores[m][s.test])
            assert rows[m]["auroc"] == pytest.approx(
                roc_auc_score(s.labels[s.test][ok], v[ok]), abs=1e-12
            )
            r = report["methods"][m]
            assert [rows[m]["auroc"], rows[m]["auroc_lo"], rows[m]["auroc_hi"]] == [
                r["auroc"],
                *r["ci95"],
            ]
            assert rows[m]["prr"] == pytest.approx(r["metrics"]["prr"], abs=1e-12)
            assert [rows[m]["pr_auc_lo"], rows[m]["pr_auc_hi"]] == r["metrics_ci95"][
                "pr_auc_hallucinated"
            ]
            assert rows[m]["fpr_at_95"] == pytest.approx(r["metrics"]["fpr_at_95_tpr"], abs=1e-12)
            assert [rows[m]["fpr_at_95_lo"], rows[m]["fpr_at_95_hi"]] == r["metrics_ci95"][
                "fpr_at_95_tpr"
            ]
            assert rows[m]["n"] == r["n"] and rows[m]["n_pos"] == r["n_hallucinated"]
            assert rows[m]["family"] == r["family"] and rows[m]["bootstrap"] == BOOT


def test_cells_not_run_or_not_evaluated_are_named(compared):
    assert set(compared.skipped) == {"synthetic__seed2", "synthetic__seed3"}
    assert "hallulog evaluate --artifact-root" in compared.skipped["synthetic__seed2"]
    assert "no run root" in compared.skipped["synthetic__seed3"]
    report = (compared.out / "report.md").read_text()
    assert "synthetic__seed3 |" in report and "skipped, no run root" in report
    assert "## FPR at 95 % TPR" in report


def test_paired_rows_only_between_cells_sharing_prompts(synthetic_study, compared):
    paired = pq.read_table(compared.out / "paired.parquet").to_pylist()
    assert {(r["cell_a"], r["cell_b"]) for r in paired} == {
        ("synthetic__seed0", "synthetic__seed1")
    }
    a, b = (_cell_scores(synthetic_study, n) for n in EVALUATED[:2])
    ids_a = {p: i for i, p in enumerate(a.prompt_ids)}
    shared = sorted(set(a.prompt_ids) & set(b.prompt_ids))
    ia = np.array([ids_a[p] for p in shared])
    ib = np.array([b.prompt_ids.index(p) for p in shared])
    for r in paired:
        m = r["method"]
        want = paired_differences(
            a.labels[ia],
            a.scores[m][ia],
            b.scores[m][ib],
            labels_b=b.labels[ib],
            n_boot=BOOT,
            seed=0,
        )
        assert r["n"] == want["n"] == len(shared)
        for metric in ("auroc", "prr"):
            d = want[metric]
            assert [r[f"{metric}_diff"], r[f"{metric}_diff_lo"], r[f"{metric}_diff_hi"]] == [
                d["diff"],
                *d["ci95"],
            ]
            assert r[f"{metric}_p_le_0"] == d["p_le_0"]


def test_transfer_matrix_pairs_only_one_models_cells(synthetic_study, compared):
    rows = pq.read_table(compared.out / "transfer.parquet").to_pylist()
    table = {(r["cell"], r["method"]): r for r in compared.table}
    for probe in ("got_logistic_last", "got_massmean_last"):
        mine = {(r["train_cell"], r["test_cell"]): r for r in rows if r["method"] == probe}
        group = EVALUATED[:2]
        assert set(mine) == {(x, y) for x in group for y in group} | {("synthetic-3l__seed0",) * 2}
        for (train, test), r in mine.items():
            assert r["in_domain"] == (train == test)
            if train == test:  # the diagonal: the cell's own k-fold figure
                assert r["auroc"] == table[(train, probe)]["auroc"] and r["layer"] is None
    assert compared.transfer_stats.groups == [EVALUATED[:2], ["synthetic-3l__seed0"]]


def test_transfer_equals_evaluate_with_a_train_root(synthetic_study, compared):
    cells = synthetic_study / "cells"
    report = evaluate(
        cells / "synthetic__seed1",
        train_root=cells / "synthetic__seed0",
        methods=["geometry"],
        embeddings=False,
        n_boot=BOOT,
    )
    for probe in ("got_logistic_last", "got_massmean_last"):
        row = next(
            r
            for r in compared.transfer
            if r["method"] == probe
            and r["train_cell"] == "synthetic__seed0"
            and r["test_cell"] == "synthetic__seed1"
        )
        want = report["methods"][probe]
        assert row["auroc"] == want["auroc"] and [row["auroc_lo"], row["auroc_hi"]] == want["ci95"]
        assert [row["layer"]] == want["selected_layers"]


@pytest.mark.slow  # matplotlib's import and seven figures: seconds
def test_heatmaps_of_the_table_and_of_each_transfer_matrix(compared, tmp_path):
    from hallulog.study.plots import table_heatmaps, transfer_heatmaps

    made = table_heatmaps(compared.table, EVALUATED, tmp_path)
    made += transfer_heatmaps(compared.transfer, EVALUATED, tmp_path)
    assert made[:2] == ["auroc.png", "prr.png"]
    assert "transfer_got_logistic_last.png" in made
    for name in made:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # evaluates two cells with every method: seconds
def test_evaluate_first_scores_finished_cells_or_names_why_not(tmp_path):
    from hallulog.study import compare, root_cells

    from tests.evaluation.synthetic import make_run

    good = make_run(tmp_path / "good", n=40, k=2)
    one_class = make_run(tmp_path / "one_class", n=20, k=2, labels=[0] * 20)
    cells = root_cells([good, one_class])
    skipped = compare(cells, tmp_path / "c0", plots=False, transfer=False).skipped
    assert set(skipped) == {"good", "one_class"} and "--evaluate" in skipped["good"]
    result = compare(
        cells, tmp_path / "c1", plots=False, transfer=False, evaluate_missing=True, embeddings=False
    )
    assert (good / "evaluation" / "scores.parquet").is_file()
    assert {r["cell"] for r in result.table} == {"good"}
    assert "AUROC needs both classes" in result.skipped["one_class"]

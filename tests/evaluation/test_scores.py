"""``evaluation/scores.parquet``: per-prompt scores from which the report's figures come.

The report's AUROC and PRR are recomputed from the parquet file alone (pyarrow, scikit-learn
and LM-Polygraph's PredictionRejectionArea; nothing from the evaluation package).
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from hallulog.cli.app import main
from sklearn.metrics import roc_auc_score

from tests.evaluation.lm_polygraph_ref import ue_metric
from tests.evaluation.synthetic import make_run


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    root = make_run(tmp_path_factory.mktemp("scores") / "run", n=60, k=4, seed=5)
    assert (
        main(
            [
                "evaluate",
                "--artifact-root",
                str(root),
                "--no-embeddings",
                "--no-plots",
                "--bootstrap",
                "40",
            ]
        )
        == 0
    )
    return root


def test_the_report_is_recomputed_from_the_parquet_alone(evaluated):
    t = pq.read_table(evaluated / "evaluation" / "scores.parquet")
    table = t.to_pydict()
    meta = json.loads(t.schema.metadata[b"hallulog.scores"])
    report = json.loads((evaluated / "evaluation" / "report.json").read_text())
    fixed = {"prompt_id", "label", "fold", "test", *meta["guards"]}
    assert set(table) - fixed == set(report["methods"]) == set(meta["methods"])
    assert "leaked" in meta["guards"]
    y_all = np.array(table["label"])
    test = np.array(table["test"], bool)
    assert (
        len(set(table["prompt_id"]))
        == len(y_all)
        == report["labels"]["correct"] + report["labels"]["hallucinated"]
    )
    pra = ue_metric("pred_rej_area").PredictionRejectionArea()
    checked_prr = 0
    for m, r in report["methods"].items():
        s = np.array(table[m], np.float64)[test]
        ok = np.isfinite(s)
        y, s = y_all[test][ok], s[ok]
        assert r["n"] == len(y)
        assert r["auroc"] == pytest.approx(roc_auc_score(y, s), abs=1e-12), m
        if len(np.unique(s)) == len(s):  # no ties: LM-Polygraph's order is the only one
            q = 1.0 - y
            val, oracle, rnd = pra(list(s), list(q)), pra(list(-q), list(q)), q.mean()
            assert r["metrics"]["prr"] == pytest.approx((val - rnd) / (oracle - rnd), abs=1e-9), m
            checked_prr += 1
    assert checked_prr >= 10


def test_folds_and_probabilities_are_recorded(evaluated):
    t = pq.read_table(evaluated / "evaluation" / "scores.parquet")
    meta = json.loads(t.schema.metadata[b"hallulog.scores"])
    assert set(meta["probability"]) == {
        "got_logistic_last",
        "lkm_exact_answer",
        "saplma_last",
        "layer_transition_last",
        "question_logistic_tbg",
        "question_mlp_tbg",
        "icr_probe",
    }
    folds = t.column("fold").to_numpy()
    assert sorted(set(folds.tolist())) == [0, 1, 2, 3, 4]
    report = json.loads((evaluated / "evaluation" / "report.json").read_text())
    assert "ece" in report["methods"]["saplma_last"]["metrics"]
    assert "ece" not in report["methods"]["logprob_min"]["metrics"]
    comp = report["comparison"]
    assert comp["best"] in report["methods"] and len(comp["against"]) == len(report["methods"]) - 1

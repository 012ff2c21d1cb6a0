"""The report's metrics against the implementations the field uses.

AUROC, PR-AUC of each class and the Brier score against scikit-learn; PRA/PRR, RCC-AUC and ECE
against LM-Polygraph's own ``ue_metrics`` modules (tests/evaluation/lm_polygraph_ref.py), on
fixtures with and without tied scores. The bootstrap's weighted forms must equal the metrics
on the explicitly resampled arrays.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hallulog.evaluation.metrics import (
    _all_weighted,
    average_precision,
    brier,
    ece,
    metric_intervals,
    paired_differences,
    point_metrics,
    pra,
    prr,
    rcc_auc,
)
from hallulog.evaluation.protocol import resample_counts
from sklearn.metrics import average_precision_score, brier_score_loss, roc_auc_score

from tests.evaluation.lm_polygraph_ref import ue_metric


def _fixture(seed, n=120, ties=False):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    s = rng.normal(size=n) + 0.8 * y
    if ties:
        s = np.round(s * 2) / 2  # a handful of distinct values
    p = 1 / (1 + np.exp(-(s + rng.normal(scale=0.5, size=n))))
    return y, s, p


def _lmpg_prr_parts(y, s):
    pra_ref = ue_metric("pred_rej_area").PredictionRejectionArea()
    q = (1 - y).astype(float)
    return pra_ref(list(s), list(q)), pra_ref(list(-q), list(q))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tie_free_metrics_equal_sklearn_and_lm_polygraph(seed):
    y, s, p = _fixture(seed)
    m = point_metrics(y, s, p)
    assert m["auroc"] == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert m["auroc"] == pytest.approx(ue_metric("roc_auc").ROCAUC()(list(s), list(y)), abs=1e-12)
    assert m["pr_auc_hallucinated"] == pytest.approx(average_precision_score(y, s), abs=1e-12)
    assert m["pr_auc_correct"] == pytest.approx(average_precision_score(1 - y, -s), abs=1e-12)
    pr_auc = ue_metric("pr_auc").PRAUC
    assert m["pr_auc_hallucinated"] == pytest.approx(pr_auc()(list(s), list(y)), abs=1e-12)
    assert m["pr_auc_correct"] == pytest.approx(
        pr_auc(positive_class=0, negative_class=1)(list(s), list(y)), abs=1e-12
    )
    val, oracle = _lmpg_prr_parts(y, s)
    assert pra(y, s) == pytest.approx(val, abs=1e-9)
    rnd = float(np.mean(1 - y))
    assert m["prr"] == pytest.approx((val - rnd) / (oracle - rnd), abs=1e-9)
    rcc = ue_metric("risk_cov_curve").RiskCoverageCurveAUC()
    assert m["rcc_auc"] == pytest.approx(rcc(list(s), list(1 - y)), abs=1e-9)
    # LM-Polygraph's ECE takes an uncertainty (confidence = -estimator) and the quality
    assert m["ece"] == pytest.approx(ue_metric("ece").ECE()(list(p - 1), list(1 - y)), abs=1e-9)
    assert m["brier"] == pytest.approx(brier_score_loss(y, p), abs=1e-12)


def test_random_rejection_is_the_mean_quality_and_lm_polygraph_estimates_it():
    """PRR's random baseline: the expected PRA over all orders is the mean quality (every
    permutation of 7 answers), which LM-Polygraph estimates with 1000 random orders."""
    y = np.array([1, 0, 0, 1, 1, 0, 1])
    q = 1 - y
    pra_ref = ue_metric("pred_rej_area").PredictionRejectionArea()
    vals = [pra_ref(list(perm), list(q)) for perm in itertools.permutations(range(7))]
    assert np.mean(vals) == pytest.approx(q.mean(), abs=1e-12)
    ue = ue_metric("ue_metric")
    est = ue.get_random_scores(pra_ref, q.astype(float))
    assert est == pytest.approx(q.mean(), abs=0.01)


def test_tied_scores_average_lm_polygraph_over_the_tie_orders():
    """With ties LM-Polygraph's argsort picks one order; ours is the mean over all of them."""
    y = np.array([1, 0, 0, 1, 1, 0, 1, 0])
    s = np.array([0.5, 0.5, 0.1, 0.9, 0.5, 0.1, 0.9, 0.3])
    pra_ref = ue_metric("pred_rej_area").PredictionRejectionArea()
    rcc_ref = ue_metric("risk_cov_curve").RiskCoverageCurveAUC()
    q = (1 - y).astype(float)
    groups = [np.flatnonzero(s == v) for v in np.unique(s)]
    pras, rccs = [], []
    for orders in itertools.product(*[itertools.permutations(g) for g in groups]):
        tiebreak = s.copy()
        for order in orders:  # every order within every tie group
            tiebreak[list(order)] += 1e-9 * np.arange(len(order))
        pras.append(pra_ref(list(tiebreak), list(q)))
        rccs.append(rcc_ref(list(tiebreak), list(q)))
    assert len(pras) == 3 * 2 * 2 * 2
    assert pra(y, s) == pytest.approx(np.mean(pras), abs=1e-12)
    assert rcc_auc(y, s) == pytest.approx(np.mean(rccs), abs=1e-12)
    assert pra(y, s) + rcc_auc(y, s) == pytest.approx(1.0, abs=1e-12)
    assert len(set(np.round(pras, 12))) > 1  # the ties matter here


@pytest.mark.parametrize("ties", [False, True])
def test_tied_auroc_and_average_precision_equal_sklearn(ties):
    y, s, p = _fixture(5, ties=ties)
    assert point_metrics(y, s)["auroc"] == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert average_precision(y, s) == pytest.approx(average_precision_score(y, s), abs=1e-12)
    assert average_precision(1 - y, -s) == pytest.approx(
        average_precision_score(1 - y, -s), abs=1e-12
    )
    assert ece(y, p) == pytest.approx(ue_metric("ece").ECE()(list(p - 1), list(1 - y)), abs=1e-9)
    assert brier(y, p) == pytest.approx(brier_score_loss(y, p), abs=1e-12)


def test_bootstrap_forms_equal_the_metrics_on_resampled_arrays():
    y, s, p = _fixture(7, n=60, ties=True)
    counts = resample_counts(len(y), 20, seed=3)
    weighted = _all_weighted(y, s, counts, p)
    for b in range(len(counts)):
        idx = np.repeat(np.arange(len(y)), counts[b])
        yy, ss, pp = y[idx], s[idx], p[idx]
        ref = point_metrics(yy, ss, pp)
        for k, v in ref.items():
            assert weighted[k][b] == pytest.approx(v, abs=1e-12), (k, b)
        assert ref["prr"] == pytest.approx(prr(yy, ss), abs=1e-12)
        assert ref["pr_auc_hallucinated"] == pytest.approx(
            average_precision_score(yy, ss), abs=1e-12
        )


def test_intervals_hold_the_point_and_the_paired_difference_is_paired():
    y, s, p = _fixture(11, n=150)
    ci = metric_intervals(y, s, p, n_boot=200, seed=0)
    m = point_metrics(y, s, p)
    for k in ("auroc", "prr", "pr_auc_hallucinated", "pr_auc_correct", "ece", "brier"):
        lo, hi = ci[k]
        assert lo <= m[k] + 0.02 and m[k] - 0.02 <= hi and lo < hi, k
    noisy = s + np.random.default_rng(1).normal(scale=2.0, size=len(s))
    d = paired_differences(y, s, noisy, n_boot=300, seed=0)
    assert d["auroc"]["diff"] == pytest.approx(roc_auc_score(y, s) - roc_auc_score(y, noisy))
    assert d["auroc"]["ci95"][0] > 0 and d["auroc"]["p_le_0"] < 0.05
    same = paired_differences(y, s, s.copy(), n_boot=50, seed=0)
    assert same["auroc"]["diff"] == 0 and same["auroc"]["ci95"] == [0.0, 0.0]

"""The metrics the field reports, each with its percentile interval from one bootstrap.

Conventions (docs/evaluation.md, "Metrics"): ``labels`` is 1 for a hallucinated answer, 0 for a
correct one; ``scores`` are oriented higher = more likely hallucinated (an *uncertainty* in
LM-Polygraph's terms); the *quality* of an answer is ``1 - label``.

- AUROC: P(score of a hallucinated answer > score of a correct one), ties half
  (``protocol.auroc``, equal to ``sklearn.metrics.roc_auc_score``).
- PR-AUC of each class: average precision (``sklearn.metrics.average_precision_score``) with
  the hallucinated class positive (scores as they are), and with the correct class positive
  (scores negated).
- PRA / PRR: LM-Polygraph's ``PredictionRejectionArea`` (max_rejection 1): answers sorted by
  increasing uncertainty, PRA = (1/n) sum_{m=1..n} mean quality of the m least uncertain; PRR =
  (PRA - random) / (oracle - random), the oracle ranking by quality, random the expected PRA of
  a random ranking (exactly the mean quality). Ties of the score are averaged over their orders
  (LM-Polygraph's ``np.argsort`` picks one order; equal on scores without ties).
- RCC-AUC: LM-Polygraph's ``RiskCoverageCurveAUC`` (normalised): mean over coverages m/n of the
  risk (hallucination rate) of the m least uncertain answers; for 0/1 labels 1 - PRA.
- FPR@95: the false-positive rate at the highest threshold whose true-positive rate (share of
  hallucinated answers scored at or above it) reaches 95 %, tied scores one threshold (what
  ``sklearn.metrics.roc_curve`` gives at the first point with TPR >= 0.95); lower is better.
- Risk-coverage curve: the hallucination rate of the m least uncertain answers at coverage
  m / n, ties averaged over their orders (``risk_coverage``; its mean over m is RCC-AUC).
- ECE (20 equal-width bins over [0, 1], LM-Polygraph's ``ECE``) and the Brier score
  (``sklearn.metrics.brier_score_loss``), only for methods whose score is a probability of
  hallucination: confidence = 1 - p, accuracy = quality.

Every metric of a method is computed on the same resamples (multiplicities of each prompt), so
its intervals come from one bootstrap; ``paired_differences`` uses one resample set for two
methods (the prompts both scored).
"""

from __future__ import annotations

import numpy as np
from hallulog.evaluation.protocol import (
    auroc,
    bootstrap_chunk,
    iter_resample_counts,
    weighted_aurocs,
)

__all__ = [
    "METRICS",
    "point_metrics",
    "metric_intervals",
    "paired_differences",
    "PAIRED_METRICS",
    "resampled_metrics",
    "paired_point",
    "difference_summary",
    "ECE_BINS",
    "prr",
    "pra",
    "rcc_auc",
    "fpr_at_tpr",
    "risk_coverage",
    "risk_curve",
    "COVERAGES",
    "average_precision",
    "ece",
    "brier",
]

ECE_BINS = 20
#: the coverages of the risk-coverage table (share of answers kept, least uncertain first)
COVERAGES = tuple(round(0.1 * i, 1) for i in range(1, 11))
#: the true-positive rate of FPR@95
TPR_TARGET = 0.95
#: metric → True when higher is better
METRICS = {
    "auroc": True,
    "pr_auc_hallucinated": True,
    "pr_auc_correct": True,
    "prr": True,
    "rcc_auc": False,
    "fpr_at_95_tpr": False,
    "ece": False,
    "brier": False,
}


def _groups(scores: np.ndarray):
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    starts = np.concatenate(([0], np.flatnonzero(np.diff(s)) + 1))
    return order, starts


def _w_pra(scores: np.ndarray, quality: np.ndarray, w: np.ndarray) -> np.ndarray:
    """PRA of each row of multiplicities ``w`` (ties averaged): the answer at rank i (1-based,
    increasing uncertainty) weighs H_n - H_{i-1}; a tie group the mean weight of its ranks."""
    order, starts = _groups(scores)
    w = w[:, order].astype(np.float64)
    q = quality[order].astype(np.float64)
    c = np.add.reduceat(w, starts, axis=1)  # multiplicity of each tie group
    qs = np.add.reduceat(w * q, starts, axis=1)  # its summed quality
    n = w.sum(1)
    nmax = int(n.max()) if len(n) else 0
    h = np.concatenate(([0.0], np.cumsum(1.0 / np.arange(1, nmax + 1))))  # H_0..H_nmax
    ch = np.concatenate(([0.0], np.cumsum(h)))  # ch[k] = H_0 + ... + H_{k-1}
    end = np.cumsum(c, axis=1).astype(np.int64)
    beg = end - c.astype(np.int64)
    hn = h[n.astype(np.int64)][:, None]
    # sum over ranks i = beg+1..end of (H_n - H_{i-1}) = c H_n - (ch[end] - ch[beg])
    wsum = c * hn - (ch[end] - ch[beg])
    with np.errstate(invalid="ignore", divide="ignore"):
        avg = np.where(c > 0, wsum / np.where(c > 0, c, 1), 0.0)
        return (qs * avg).sum(1) / n


def pra(labels, scores) -> float:
    """Prediction-rejection area (quality = 1 - label), ties averaged."""
    y, s = np.asarray(labels), np.asarray(scores, np.float64)
    return float(_w_pra(s, 1 - y, np.ones((1, len(y))))[0])


def _w_prr(scores, labels, w) -> np.ndarray:
    q = 1 - labels
    n = w.sum(1)
    rnd = (w * q).sum(1) / n
    ora = _w_pra(-q.astype(np.float64), q, w)
    val = _w_pra(scores, q, w)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(ora != rnd, (val - rnd) / (ora - rnd), np.nan)


def prr(labels, scores) -> float:
    """Prediction-rejection ratio, normalised by the oracle and the random ranking."""
    y, s = np.asarray(labels), np.asarray(scores, np.float64)
    return float(_w_prr(s, y, np.ones((1, len(y))))[0])


def rcc_auc(labels, scores) -> float:
    """Area under the (normalised) risk-coverage curve; lower is better."""
    y, s = np.asarray(labels), np.asarray(scores, np.float64)
    return float(_w_pra(s, y.astype(np.float64), np.ones((1, len(y))))[0])


def _w_ap(scores: np.ndarray, positive: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Average precision (sklearn's step-wise sum) of each row of multiplicities, thresholds
    from the highest score down, ties one threshold."""
    order, starts = _groups(-scores)
    w = w[:, order].astype(np.float64)
    pos = positive[order].astype(bool)
    tp = np.cumsum(np.add.reduceat(np.where(pos, w, 0.0), starts, axis=1), axis=1)
    fp = np.cumsum(np.add.reduceat(np.where(pos, 0.0, w), starts, axis=1), axis=1)
    p_total = tp[:, -1:]
    dtp = np.diff(np.concatenate((np.zeros((len(w), 1)), tp), axis=1), axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        prec = np.where(tp + fp > 0, tp / np.where(tp + fp > 0, tp + fp, 1), 0.0)
        return np.where(p_total[:, 0] > 0, (dtp * prec).sum(1) / p_total[:, 0], np.nan)


def average_precision(positive, scores) -> float:
    """Average precision of ``scores`` for the class marked 1 in ``positive``."""
    p, s = np.asarray(positive), np.asarray(scores, np.float64)
    return float(_w_ap(s, p, np.ones((1, len(p))))[0])


def _w_fpr(scores: np.ndarray, labels: np.ndarray, w: np.ndarray, tpr: float = TPR_TARGET):
    """FPR at the first threshold (from the highest score down, ties one threshold) whose TPR
    reaches ``tpr``, for each row of multiplicities."""
    order, starts = _groups(-scores)
    w = w[:, order].astype(np.float64)
    pos = labels[order] == 1
    tp = np.cumsum(np.add.reduceat(np.where(pos, w, 0.0), starts, axis=1), axis=1)
    fp = np.cumsum(np.add.reduceat(np.where(pos, 0.0, w), starts, axis=1), axis=1)
    p_total, n_total = tp[:, -1], fp[:, -1]
    with np.errstate(invalid="ignore", divide="ignore"):
        reached = tp >= tpr * p_total[:, None] - 1e-9 * np.maximum(p_total[:, None], 1.0)
        first = np.argmax(reached, axis=1)
        out = fp[np.arange(len(w)), first] / n_total
        return np.where((p_total > 0) & (n_total > 0), out, np.nan)


def fpr_at_tpr(labels, scores, tpr: float = TPR_TARGET) -> float:
    """False-positive rate at the first threshold whose true-positive rate reaches ``tpr``."""
    y, s = np.asarray(labels), np.asarray(scores, np.float64)
    return float(_w_fpr(s, y, np.ones((1, len(y))), tpr)[0])


def risk_curve(labels, scores) -> tuple[np.ndarray, np.ndarray]:
    """(coverage m / n, hallucination rate of the m least uncertain answers) for m = 1..n, ties
    averaged over their orders (a tie group cut by m counts with its mean label)."""
    y, s = np.asarray(labels, np.float64), np.asarray(scores, np.float64)
    n = len(y)
    if not n:
        return np.empty(0), np.empty(0)
    order, starts = _groups(s)
    ends = np.concatenate((starts[1:], [n]))
    group_mean = np.add.reduceat(y[order], starts) / (ends - starts)
    m = np.arange(1, n + 1)
    return m / n, np.cumsum(np.repeat(group_mean, ends - starts)) / m


def risk_coverage(labels, scores, coverages=COVERAGES) -> list[float]:
    """The risk-coverage curve at each coverage ``c`` (the ``max(1, round(c n))`` least
    uncertain answers)."""
    n = len(labels)
    if not n:
        return [float("nan")] * len(coverages)
    _, risk = risk_curve(labels, scores)
    return [float(risk[max(1, int(round(c * n))) - 1]) for c in coverages]


def _w_ece(prob: np.ndarray, labels: np.ndarray, w: np.ndarray, bins: int = ECE_BINS):
    conf = 1.0 - prob
    edges = np.linspace(0.0, 1.0, bins + 1)
    # bin 0 is [0, e1], bin i > 0 is (e_i, e_{i+1}] (LM-Polygraph's ECE)
    b = np.clip(np.searchsorted(edges, conf, side="left") - 1, 0, bins - 1)
    onehot = np.zeros((len(conf), bins))
    onehot[np.arange(len(conf)), b] = 1.0
    inside = (conf >= 0.0) & (conf <= 1.0)
    onehot[~inside] = 0.0
    wb = w @ onehot
    acc = (w * (1 - labels)) @ onehot
    cf = (w * conf) @ onehot
    with np.errstate(invalid="ignore", divide="ignore"):
        gap = np.where(wb > 0, np.abs(acc - cf) / np.where(wb > 0, wb, 1), 0.0)
    return (wb * gap).sum(1) / w.sum(1)


def ece(labels, prob, bins: int = ECE_BINS) -> float:
    """Expected calibration error of P(hallucinated) = ``prob``."""
    y, p = np.asarray(labels), np.asarray(prob, np.float64)
    return float(_w_ece(p, y, np.ones((1, len(y))), bins)[0])


def _w_brier(prob, labels, w):
    return (w * (prob - labels) ** 2).sum(1) / w.sum(1)


def brier(labels, prob) -> float:
    y, p = np.asarray(labels), np.asarray(prob, np.float64)
    return float(np.mean((p - y) ** 2))


def _all_weighted(labels, scores, w, prob) -> dict[str, np.ndarray]:
    out = {
        "auroc": weighted_aurocs(labels, scores, w),
        "pr_auc_hallucinated": _w_ap(scores, labels == 1, w),
        "pr_auc_correct": _w_ap(-scores, labels == 0, w),
        "prr": _w_prr(scores, labels, w),
        "rcc_auc": _w_pra(scores, labels.astype(np.float64), w),
        "fpr_at_95_tpr": _w_fpr(scores, labels, w),
    }
    if prob is not None:
        out["ece"] = _w_ece(prob, labels, w)
        out["brier"] = _w_brier(prob, labels, w)
    return out


def point_metrics(labels, scores, prob=None) -> dict[str, float]:
    """Every metric on the given prompts (``prob``: P(hallucinated), or None)."""
    y, s = np.asarray(labels), np.asarray(scores, np.float64)
    out = {
        k: float(v[0])
        for k, v in _all_weighted(
            y, s, np.ones((1, len(y))), None if prob is None else np.asarray(prob, np.float64)
        ).items()
    }
    out["auroc"] = auroc(y, s)
    return out


def metric_intervals(
    labels,
    scores,
    prob=None,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    chunk: int | None = None,
) -> dict[str, list[float]]:
    """Percentile intervals of every metric from the same resamples of the prompts (the ones
    ``protocol.bootstrap_ci`` draws, so the AUROC interval is unchanged)."""
    y, s = np.asarray(labels), np.asarray(scores, np.float64)
    p = None if prob is None else np.asarray(prob, np.float64)
    if not len(y):
        return {}
    vals: dict[str, list[np.ndarray]] = {}
    for counts in iter_resample_counts(len(y), n_boot, seed, chunk):
        for k, v in _all_weighted(y, s, counts, p).items():
            vals.setdefault(k, []).append(v)
    out = {}
    for k, parts in vals.items():
        v = np.concatenate(parts)
        v = v[np.isfinite(v)]
        out[k] = (
            [float(x) for x in np.percentile(v, [100 * (1 - level) / 2, 100 * (1 + level) / 2])]
            if len(v)
            else [float("nan"), float("nan")]
        )
    return out


#: the metrics of a paired comparison: name -> f(labels, scores, multiplicities) per resample
PAIRED_METRICS = {
    "auroc": weighted_aurocs,
    "prr": lambda y, s, w: _w_prr(s, y, w),
}


def resampled_metrics(labels, scores, counts, *, chunk: int | None = None) -> dict:
    """``{metric: value per resample}`` of each :data:`PAIRED_METRICS` metric, the resamples
    given as multiplicities: one ``(resamples, prompts)`` array (scored ``chunk`` rows at a
    time) or an iterable of row blocks (``protocol.iter_resample_counts``)."""
    y, s = np.asarray(labels), np.asarray(scores, np.float64)
    if isinstance(counts, np.ndarray):
        c = chunk or bootstrap_chunk(len(y))
        counts = (counts[i : i + c] for i in range(0, len(counts), c))
    parts: dict[str, list[np.ndarray]] = {name: [] for name in PAIRED_METRICS}
    for block in counts:
        for name, f in PAIRED_METRICS.items():
            parts[name].append(f(y, s, block))
    return {name: np.concatenate(v) if v else np.empty(0) for name, v in parts.items()}


def paired_point(labels, scores) -> dict[str, float]:
    """Each :data:`PAIRED_METRICS` metric on the prompts as they are (multiplicity 1)."""
    y, s = np.asarray(labels), np.asarray(scores, np.float64)
    ones = np.ones((1, len(y)))
    return {name: float(f(y, s, ones)[0]) for name, f in PAIRED_METRICS.items()}


def difference_summary(
    point_a: float, point_b: float, va: np.ndarray, vb: np.ndarray, level: float = 0.95
) -> dict:
    """``{diff, ci95, p_le_0}`` of metric(a) - metric(b): the point difference, the percentile
    interval of the resampled differences ``va - vb`` and the share of them <= 0."""
    d = va - vb
    d = d[np.isfinite(d)]
    lo, hi = (
        np.percentile(d, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
        if len(d)
        else (np.nan, np.nan)
    )
    return {
        "diff": float(point_a - point_b),
        "ci95": [float(lo), float(hi)],
        "p_le_0": float((d <= 0).mean()) if len(d) else float("nan"),
    }


def paired_differences(
    labels,
    a,
    b,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    chunk: int | None = None,
    labels_b=None,
) -> dict:
    """Paired bootstrap of AUROC(a) - AUROC(b) and PRR(a) - PRR(b) over the prompts both score
    (the same resamples for both methods): point difference, interval, and the share of
    resamples where the difference is <= 0 (a one-sided bootstrap p-value).

    ``labels_b``: the labels of ``b`` where they differ from ``a``'s (one detector on two runs
    that asked the same prompts: each run's answer has its own label); default ``labels``."""
    y = np.asarray(labels)
    yb = y if labels_b is None else np.asarray(labels_b)
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    ok = np.isfinite(a) & np.isfinite(b)
    y, yb, a, b = y[ok], yb[ok], a[ok], b[ok]
    out = {"n": int(ok.sum())}
    if not len(y) or len(np.unique(y)) < 2 or len(np.unique(yb)) < 2:
        return out
    va = resampled_metrics(y, a, iter_resample_counts(len(y), n_boot, seed, chunk))
    vb = resampled_metrics(yb, b, iter_resample_counts(len(y), n_boot, seed, chunk))
    pa, pb = paired_point(y, a), paired_point(yb, b)
    for name in PAIRED_METRICS:
        out[name] = difference_summary(pa[name], pb[name], va[name], vb[name], level)
    return out

"""Evaluation protocol: prompt-id splits with a fixed seed, AUROC, bootstrap intervals.

Scores are oriented so that a *higher* score means *more likely hallucinated* (label 1).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

__all__ = [
    "Split",
    "make_split",
    "auroc",
    "bootstrap_ci",
    "summarize",
    "KFOLD_MAX",
    "resample_counts",
    "iter_resample_counts",
    "bootstrap_chunk",
    "weighted_aurocs",
]

#: up to this many labelled prompts the probes use k-fold cross-fitting, above it one holdout split
KFOLD_MAX = 5000


@dataclass(frozen=True)
class Split:
    """Fold of every prompt (``fold[i]`` in 0..k-1).

    k-fold: every prompt is scored by the model fitted on the other folds. ``holdout``: fold 0
    is the test set, fold 1 a validation set (probe layer selection), fold 2 the training set.
    """

    fold: np.ndarray
    k: int
    holdout: bool
    seed: int

    def test_mask(self) -> np.ndarray:
        return self.fold == 0 if self.holdout else np.ones(len(self.fold), bool)

    def folds(self):
        """(train mask, test mask) pairs."""
        if self.holdout:
            yield self.fold == 2, self.fold != 2
            return
        for f in range(self.k):
            test = self.fold == f
            yield ~test, test

    def selection_masks(self):
        """(test mask, mask whose scores choose the layer for it) pairs."""
        if self.holdout:
            yield self.fold == 0, self.fold == 1
            return
        for f in range(self.k):
            yield self.fold == f, self.fold != f


def _unit_hash(prompt_id: str, seed: int) -> float:
    h = hashlib.sha256(f"{seed}:{prompt_id}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2.0**64


def make_split(
    prompt_ids: list[str],
    labels: np.ndarray,
    *,
    seed: int = 0,
    k: int = 5,
    holdout_fraction: float = 0.2,
) -> Split:
    """Folds by prompt id: the order is a hash of (seed, prompt_id). Stratified: each class is
    dealt round-robin over the folds in hash order. Above ``KFOLD_MAX`` prompts: a test fold of
    ``holdout_fraction``, a validation fold of 0.8 x that, the rest for training."""
    n = len(prompt_ids)
    keys = np.array([_unit_hash(p, seed) for p in prompt_ids])
    fold = np.zeros(n, np.int64)
    holdout = n > KFOLD_MAX
    if holdout:
        fold = np.where(keys < holdout_fraction, 0, np.where(keys < 1.8 * holdout_fraction, 1, 2))
        return Split(fold=fold, k=3, holdout=True, seed=seed)
    for cls in (0, 1):
        idx = np.flatnonzero(labels == cls)
        idx = idx[np.argsort(keys[idx], kind="stable")]
        fold[idx] = np.arange(len(idx)) % k
    return Split(fold=fold, k=k, holdout=False, seed=seed)


def auroc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U with midranks for ties); NaN if one class."""
    labels = np.asarray(labels)
    scores = np.asarray(scores, np.float64)
    pos = labels == 1
    n1, n0 = int(pos.sum()), int((~pos).sum())
    if n1 == 0 or n0 == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s), np.float64)
    # midranks over tie runs
    boundaries = np.flatnonzero(np.diff(s)) + 1
    starts = np.concatenate(([0], boundaries))
    ends = np.concatenate((boundaries, [len(s)]))
    mid = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(mid, ends - starts)
    return float((ranks[pos].sum() - n1 * (n1 + 1) / 2.0) / (n1 * n0))


def resample_counts(n: int, n_boot: int, seed: int) -> np.ndarray:
    """``(n_boot, n)`` multiplicities of each prompt in each resample (drawn one resample at a
    time from ``default_rng(seed)``, so the resamples do not depend on how they are scored)."""
    parts = list(iter_resample_counts(n, n_boot, seed, chunk=max(n_boot, 1)))
    return parts[0] if parts else np.zeros((0, n), np.int32)


def bootstrap_chunk(n: int, budget: int = 1 << 18) -> int:
    """Resamples scored at once for ``n`` prompts: at most 100, and about ``budget`` prompt
    multiplicities (each temporary of a chunk is ``chunk x n`` floats: 2 MiB at the budget)."""
    return max(1, min(100, budget // max(n, 1)))


def iter_resample_counts(n: int, n_boot: int, seed: int, chunk: int | None = None):
    """The rows of ``resample_counts(n, n_boot, seed)``, ``chunk`` at a time (default
    :func:`bootstrap_chunk`): the same draws, in O(chunk x n) memory."""
    chunk = chunk or bootstrap_chunk(n)
    rng = np.random.default_rng(seed)
    for start in range(0, n_boot, chunk):
        counts = np.zeros((min(chunk, n_boot - start), n), np.int32)
        for b in range(len(counts)):
            counts[b] = np.bincount(rng.integers(0, n, n), minlength=n)
        yield counts


def weighted_aurocs(labels: np.ndarray, scores: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """AUROC of each resample given as multiplicities (rows of ``counts``), all at once.

    Equal to ``auroc`` on the resampled arrays: the Mann-Whitney count of (hallucinated,
    correct) pairs with ties as halves is an exact sum of integers and halves in float64, and
    the one division is the same.
    """
    order = np.argsort(scores, kind="mergesort")
    s, pos = scores[order], labels[order] == 1
    starts = np.concatenate(([0], np.flatnonzero(np.diff(s)) + 1))
    w = counts[:, order].astype(np.float64)
    w_pos = np.add.reduceat(np.where(pos, w, 0.0), starts, axis=1)
    w_neg = np.add.reduceat(np.where(pos, 0.0, w), starts, axis=1)
    below = np.cumsum(w_neg, axis=1) - w_neg  # correct answers scored strictly lower
    u = (w_pos * (below + 0.5 * w_neg)).sum(1)
    n1, n0 = w_pos.sum(1), w_neg.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((n1 > 0) & (n0 > 0), u / (n1 * n0), np.nan)


def bootstrap_ci(
    labels: np.ndarray,
    scores: np.ndarray,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    chunk: int | None = None,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the AUROC, resampling prompts with replacement.

    The resamples are drawn and scored ``chunk`` at a time (default :func:`bootstrap_chunk`;
    memory O(chunk x prompts)); the interval does not depend on it.
    """
    labels = np.asarray(labels)
    scores = np.asarray(scores, np.float64)
    n = len(labels)
    if n == 0:
        return float("nan"), float("nan")
    vals = np.concatenate(
        [
            weighted_aurocs(labels, scores, counts)
            for counts in iter_resample_counts(n, n_boot, seed, chunk)
        ]
        or [np.empty(0)]
    )
    vals = vals[np.isfinite(vals)]
    if not len(vals):
        return float("nan"), float("nan")
    lo, hi = np.percentile(vals, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(lo), float(hi)


def summarize(labels: np.ndarray, scores: np.ndarray, *, n_boot: int, seed: int) -> dict:
    """``{auroc, ci95, n, n_hallucinated}`` over the prompts whose score is finite."""
    scores = np.asarray(scores, np.float64)
    ok = np.isfinite(scores)
    y, s = np.asarray(labels)[ok], scores[ok]
    lo, hi = bootstrap_ci(y, s, n_boot=n_boot, seed=seed)
    return {
        "auroc": auroc(y, s),
        "ci95": [lo, hi],
        "n": int(ok.sum()),
        "n_hallucinated": int((y == 1).sum()),
    }

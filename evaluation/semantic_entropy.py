"""Semantic Entropy (Kuhn et al., 2023; Farquhar et al., 2024) over the K sampled answers.

Answers are grouped into meaning clusters, then

- discrete SE: entropy of the cluster frequencies (``-sum_c (n_c/K) log(n_c/K)``), the
  "cluster assignment" estimator that needs no likelihoods;
- likelihood-weighted SE: each cluster's probability is the log-sum-exp of its members'
  length-normalised sequence log-likelihoods, normalised over the clusters, and the entropy is
  ``-sum_c p_c log p_c`` (Farquhar et al.'s ``sum_normalized`` Rao estimator).

Clustering: by normalised exact match (SQuAD normalisation: lower case, no punctuation, no
articles, single spaces), or by embedding equivalence (greedy, as in Farquhar et al.'s
bidirectional-entailment clustering, with "cosine >= threshold to the cluster's first member"
in place of the NLI model).
"""

from __future__ import annotations

import re
import string

import numpy as np

__all__ = [
    "normalize_answer",
    "cluster_exact",
    "cluster_embedding",
    "discrete_entropy",
    "weighted_entropy",
    "binarize_threshold",
    "EMBED_THRESHOLD",
]

#: cosine similarity above which two answers share a meaning (all-MiniLM-L6-v2 embeddings)
EMBED_THRESHOLD = 0.8

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    t = "".join(ch for ch in (text or "").lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", t).split())


def cluster_exact(texts: list[str]) -> list[int]:
    """Cluster id of each text: equal after ``normalize_answer``."""
    ids: dict[str, int] = {}
    return [ids.setdefault(normalize_answer(t), len(ids)) for t in texts]


def cluster_embedding(embs: np.ndarray, threshold: float = EMBED_THRESHOLD) -> list[int]:
    """Greedy clustering of L2-normalised rows: join the first cluster whose first member has
    cosine >= threshold, else open a new one."""
    reps: list[int] = []
    out: list[int] = []
    for i in range(len(embs)):
        for c, r in enumerate(reps):
            if float(embs[i] @ embs[r]) >= threshold:
                out.append(c)
                break
        else:
            reps.append(i)
            out.append(len(reps) - 1)
    return out


def discrete_entropy(cluster_ids: list[int]) -> float:
    if not cluster_ids:
        return float("nan")
    _, counts = np.unique(np.asarray(cluster_ids), return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum())


def weighted_entropy(cluster_ids: list[int], mean_logprobs: list[float]) -> float:
    """Entropy of cluster probabilities from length-normalised log-likelihoods (log-sum-exp)."""
    ll = np.asarray([np.nan if v is None else v for v in mean_logprobs], np.float64)
    ids = np.asarray(cluster_ids)
    ok = np.isfinite(ll)
    if not ok.any():
        return float("nan")
    ll, ids = ll[ok], ids[ok]
    clusters = np.unique(ids)
    log_pc = np.array([np.logaddexp.reduce(ll[ids == c]) for c in clusters])
    log_pc -= np.logaddexp.reduce(log_pc)
    return float(-(np.exp(log_pc) * log_pc).sum())


def binarize_threshold(se: np.ndarray) -> float:
    """Kossen et al.'s SEP target: the threshold splitting SE into high/low that minimises the
    summed squared error of the two groups around their means (a 1-D two-means split)."""
    v = np.sort(np.asarray(se, np.float64)[np.isfinite(se)])
    if len(v) < 2 or v[0] == v[-1]:
        return float(v[0]) if len(v) else 0.0
    n = len(v)
    c1, c2 = np.cumsum(v), np.cumsum(v * v)
    k = np.flatnonzero(np.diff(v) > 0) + 1  # split after k values, between distinct ones
    left = c2[k - 1] - c1[k - 1] ** 2 / k
    right = (c2[-1] - c2[k - 1]) - (c1[-1] - c1[k - 1]) ** 2 / (n - k)
    return float(v[k[np.argmin(left + right)] - 1])

"""Semantic Energy (Ma et al., 2025): semantic clustering with logit-based energies.

Token energy ``E(x_t) = -z(x_t)`` (the raw logit of the chosen token, before softmax); an
answer's energy is the mean over its tokens; a cluster's energy is the sum of its members'
energies divided by the number of answers. The primary answer's uncertainty is the energy of
the cluster it belongs to (clusters over the primary and the K samples): a large cluster of
confident (high-logit) answers has a very negative energy.
"""

from __future__ import annotations

import numpy as np

__all__ = ["answer_energy", "semantic_energy"]


def answer_energy(token_logits: list[float] | None) -> float:
    if not token_logits:
        return float("nan")
    return float(-np.mean(np.asarray(token_logits, np.float64)))


def semantic_energy(cluster_ids: list[int], energies: list[float], primary: int = 0) -> float:
    """Energy of the cluster holding answer ``primary`` (index into the lists)."""
    e = np.asarray(energies, np.float64)
    ids = np.asarray(cluster_ids)
    if not np.isfinite(e[primary]):
        return float("nan")
    members = (ids == ids[primary]) & np.isfinite(e)
    return float(e[members].sum() / np.isfinite(e).sum())

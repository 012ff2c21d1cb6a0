"""SelfCheckGPT (Manakul et al., 2023): consistency of the primary answer with its K samples.

- ``selfcheck_unigram``: the n-gram variant with n = 1. A unigram model with add-one smoothing
  is fitted on the K samples plus the primary; the score is the mean negative log-probability
  of the primary's words (SelfCheck's Avg(-log p)); ``selfcheck_unigram_max`` is Max(-log p).
- ``selfcheck_embedding``: one minus the mean cosine similarity between the sentence embedding
  of the primary and of each sample (a stand-in for SelfCheck-BERTScore).
"""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np

__all__ = ["words", "unigram_scores", "embedding_score"]

_WORD = re.compile(r"\w+", re.UNICODE)


def words(text: str) -> list[str]:
    return _WORD.findall((text or "").lower())


def unigram_scores(primary: str, samples: list[str]) -> tuple[float, float]:
    """(Avg(-log p), Max(-log p)) of the primary's words under the smoothed unigram model."""
    target = words(primary)
    counts = Counter(target)
    for s in samples:
        counts.update(words(s))
    if not target:
        return float("nan"), float("nan")
    total, vocab = sum(counts.values()), len(counts)
    nlp = [-math.log((counts[w] + 1) / (total + vocab)) for w in target]
    return float(sum(nlp) / len(nlp)), float(max(nlp))


def embedding_score(primary_emb: np.ndarray, sample_embs: np.ndarray) -> float:
    """1 - mean cosine(primary, sample); embeddings are L2-normalised rows."""
    if len(sample_embs) == 0:
        return float("nan")
    return float(1.0 - np.mean(sample_embs @ primary_emb))

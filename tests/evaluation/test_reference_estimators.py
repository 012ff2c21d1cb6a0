"""The sample-based detectors against LM-Polygraph's own estimators, answer set by answer set.

LM-Polygraph's estimator modules import transformers through their base class (about 10 s of
CPU), so this file runs in the slow lane (``-m e2e``). The same definitions are checked in the
fast lane by tests/evaluation/test_independent.py against a re-implementation from the docs.
"""

from __future__ import annotations

import numpy as np
import pytest
from hallulog.evaluation.hidden import eigenscore
from hallulog.evaluation.sample_methods import (
    graph_scores,
    jaccard_matrix,
    lexical_similarity,
    mc_entropies,
)

from tests.evaluation.lm_polygraph_ref import estimator

pytestmark = pytest.mark.e2e

_WORDS = [
    "Paris",
    "paris",
    "the",
    "capital",
    "of",
    "France",
    "is",
    "Lyon",
    "city",
    "running",
    "runs",
    "it's",
    "8",
    "legs.",
    "A",
    "spider",
]


def _answer_sets(n=40, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.integers(2, 7))
        base = " ".join(rng.choice(_WORDS, rng.integers(1, 6)))
        out.append(
            [
                base if rng.random() < 0.4 else " ".join(rng.choice(_WORDS, rng.integers(1, 8)))
                for _ in range(k)
            ]
        )
    return out


def test_lexical_similarity_equals_lm_polygraph():
    sets = _answer_sets()
    for metric in ("rouge1", "rouge2", "rougeL"):
        ref = estimator("lexical_similarity").LexicalSimilarity(metric)({"sample_texts": sets})
        ours = [lexical_similarity(t, metric) for t in sets]
        np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-12, err_msg=metric)


def test_graph_methods_equal_lm_polygraph_with_jaccard():
    sets = _answer_sets(seed=1)
    stats = {"sample_texts": sets}
    ref = {
        "eig": estimator("eig_val_laplacian").EigValLaplacian("Jaccard_score")(stats),
        "deg": estimator("deg_mat").DegMat("Jaccard_score")(stats),
        "ecc": estimator("eccentricity").Eccentricity("Jaccard_score")(stats),
    }
    ours = np.array([graph_scores(jaccard_matrix(t)) for t in sets])
    for j, k in enumerate(("eig", "deg", "ecc")):
        np.testing.assert_allclose(ours[:, j], ref[k], rtol=0, atol=1e-9, err_msg=k)


def test_monte_carlo_entropies_and_eigenscore_equal_lm_polygraph():
    rng = np.random.default_rng(2)
    lps = [[-rng.exponential(1.0, int(rng.integers(1, 9))) for _ in range(5)] for _ in range(20)]
    stats = {
        "sample_log_probs": [[float(x.sum()) for x in s] for s in lps],
        "sample_tokens": [[list(range(len(x))) for x in s] for s in lps],
    }
    mc = estimator("monte_carlo_sequence_entropy").MonteCarloSequenceEntropy()(stats)
    mcn = estimator(
        "monte_carlo_normalized_sequence_entropy"
    ).MonteCarloNormalizedSequenceEntropy()(stats)
    ours = np.array(
        [
            mc_entropies([{"sum_logprob": float(x.sum()), "num_tokens": len(x)} for x in s])
            for s in lps
        ]
    )
    np.testing.assert_allclose(ours[:, 0], mc, atol=1e-12)
    np.testing.assert_allclose(ours[:, 1], mcn, atol=1e-12)
    embs = [rng.normal(size=(5, 64)) for _ in range(10)]
    ref = estimator("eigenscore").EigenScore()({"sample_embeddings": embs})
    np.testing.assert_allclose([eigenscore(z) for z in embs], ref, rtol=1e-9, atol=1e-9)

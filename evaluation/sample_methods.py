"""Detectors of LM-Polygraph's and TruthTorchLM's lists that need only the stored text,
token logprobs (with the top-k alternatives) and the K samples of one pass.

Every function returns one float per answer, oriented higher = more likely hallucinated.
Definitions, papers and deviations: docs/evaluation.md ("Methods").

- token entropy (``mean_token_entropy``, ``max_token_entropy``): the entropy of each generated
  token's top-k distribution renormalised over the k stored alternatives;
- ``ccp_lexical``: Claim-Conditioned Probability (Fadeeva et al., 2024) with the NLI model
  replaced by "the alternative's text equals the chosen token's" (stripped, lower case);
- ``mc_sequence_entropy`` / ``mc_normalized_sequence_entropy``: Monte-Carlo (length-
  normalised) predictive entropy over the K samples (Kuhn et al., 2023; LM-Polygraph);
- ``lexsim_rouge1/2/L``: Lexical Similarity (Fomicheva et al., 2020; LM-Polygraph): minus the
  mean ROUGE F-measure over pairs of samples (``lexical.py``);
- ``num_sem_sets_*``, ``eigval_laplacian_*``, ``degmat_*``, ``eccentricity_*``: the graph
  methods of Lin, Trivedi & Sun (2023), *Generating with Confidence*, on a similarity matrix of
  the K samples (Jaccard of lower-cased whitespace words, as LM-Polygraph's ``Jaccard_score``,
  or the cosine of sentence embeddings);
- UQLM's scorers on stored answers (Bouchard & Chauhan, 2025), as uncertainties (1 - UQLM's
  confidence): ``probability_margin`` (mean gap between the two most likely top-k tokens),
  ``exact_match_rate`` (share of samples equal to the primary, Cole et al., 2023),
  ``monte_carlo_probability`` (mean length-normalised probability of the primary and the
  samples) and ``consistency_confidence`` (CoCoA, Vashurin et al., 2025: mean normalised
  cosine to the samples times the primary's length-normalised probability).
"""

from __future__ import annotations

import math

import numpy as np
from hallulog.evaluation.lexical import rouge_f

__all__ = [
    "token_entropies",
    "ccp_lexical",
    "mc_entropies",
    "lexical_similarity",
    "jaccard_matrix",
    "cosine_matrix",
    "graph_scores",
    "probability_margin",
    "exact_match_rate",
    "monte_carlo_probability",
    "consistency_confidence",
    "ECC_THRESHOLD",
]

#: eigenvalues of the normalised Laplacian kept by Eccentricity (LM-Polygraph's ``thres``)
ECC_THRESHOLD = 0.9


def _topk_probs(top: list[dict] | None) -> np.ndarray | None:
    lps = [t.get("logprob") for t in top or [] if t.get("logprob") is not None]
    if not lps:
        return None
    lp = np.asarray(lps, np.float64)
    lp = lp - np.logaddexp.reduce(lp)
    return np.exp(lp)


def token_entropies(top_logprobs: list[list[dict]] | None) -> tuple[float, float]:
    """(mean, max) over the generated tokens of the entropy of the renormalised top-k."""
    ents = []
    for top in top_logprobs or []:
        p = _topk_probs(top)
        if p is None:
            continue
        nz = p[p > 0]
        ents.append(float(-(nz * np.log(nz)).sum()))
    if not ents:
        return float("nan"), float("nan")
    return float(np.mean(ents)), float(np.max(ents))


def ccp_lexical(tokens: list[str] | None, top_logprobs: list[list[dict]] | None) -> float:
    """1 - prod_t CCP_t, CCP_t = (mass of the top-k alternatives whose stripped lower-cased
    text equals the chosen token's) / (mass of the top-k); a token without top-k counts 1."""
    if not tokens or not top_logprobs:
        return float("nan")
    log_prod = 0.0
    for tok, top in zip(tokens, top_logprobs):
        p = _topk_probs(top)
        if p is None or tok is None:
            continue
        key = tok.strip().lower()
        texts = [
            (t.get("token") or "").strip().lower() for t in top if t.get("logprob") is not None
        ]
        same = sum(pi for pi, t in zip(p, texts) if t == key)
        if same <= 0:
            return 1.0
        log_prod += math.log(min(1.0, same / p.sum()))
    return float(1.0 - math.exp(log_prod))


def mc_entropies(samples: list[dict]) -> tuple[float, float]:
    """(-mean_k log p(s_k), -mean_k log p(s_k) / |s_k|) over the K samples."""
    sums = [s.get("sum_logprob") for s in samples]
    lens = [s.get("num_tokens") for s in samples]
    ok = [(a, n) for a, n in zip(sums, lens) if a is not None and n]
    if not ok:
        return float("nan"), float("nan")
    return (float(-np.mean([a for a, _ in ok])), float(-np.mean([a / n for a, n in ok])))


def lexical_similarity(texts: list[str], metric: str) -> float:
    """- mean over pairs i < j of ROUGE-``metric`` F(texts[i], texts[j])."""
    sims = [
        rouge_f(texts[i], texts[j], metric)
        for i in range(len(texts))
        for j in range(i + 1, len(texts))
    ]
    return float(-np.mean(sims)) if sims else float("nan")


def jaccard_matrix(texts: list[str]) -> np.ndarray:
    """Jaccard similarity of the sets of lower-cased whitespace-separated words (1 on the
    diagonal; 0 when both sets are empty)."""
    sets = [set(t.lower().split()) for t in texts]
    n = len(sets)
    w = np.eye(n)
    for i in range(n):
        for j in range(i + 1, n):
            union = len(sets[i] | sets[j])
            w[i, j] = w[j, i] = len(sets[i] & sets[j]) / union if union else 0.0
    return w


def cosine_matrix(embs: np.ndarray) -> np.ndarray:
    """Cosine similarity of L2-normalised rows, clipped to [0, 1], 1 on the diagonal."""
    w = np.clip(np.asarray(embs, np.float64) @ np.asarray(embs, np.float64).T, 0.0, 1.0)
    np.fill_diagonal(w, 1.0)
    return w


def graph_scores(w: np.ndarray) -> tuple[float, float, float]:
    """(EigValLaplacian, DegMat, Eccentricity) of a symmetric similarity matrix ``w``.

    L = I - D^-1/2 W D^-1/2; U_EigV = sum_k max(0, 1 - lambda_k); U_Deg = trace(m I - D) / m^2;
    U_Ecc = || (||v_j - mean_j v||)_j ||, v_j the rows of the eigenvectors of L with eigenvalue
    < 0.9. Each is rounded to 12 decimals, so that graphs equal up to the order of their answers
    score equal (ties matter to the AUROC).
    """
    m = len(w)
    if m == 0:
        return float("nan"), float("nan"), float("nan")
    deg = w.sum(1)
    d = 1.0 / np.sqrt(deg)
    lap = np.eye(m) - d[:, None] * w * d[None, :]
    vals, vecs = np.linalg.eigh(lap)
    eig = float(np.maximum(0.0, 1.0 - vals).sum())
    degm = float((m - deg).sum() / m**2)
    keep = vecs[:, vals < ECC_THRESHOLD].T  # one row per kept eigenvector
    c = np.array([np.linalg.norm(x - x.mean(0)) for x in keep])
    ecc = float(np.linalg.norm(c))
    return round(eig, 12), round(degm, 12), round(ecc, 12)


def probability_margin(top_logprobs: list[list[dict]] | None) -> float:
    """1 - mean over the tokens with two or more alternatives of p_1 - p_2, the two largest
    probabilities of the stored top-k (not renormalised; UQLM's ``probability_margin``)."""
    margins = []
    for top in top_logprobs or []:
        lps = sorted(
            (t["logprob"] for t in top or [] if t.get("logprob") is not None), reverse=True
        )
        if len(lps) >= 2:
            margins.append(math.exp(lps[0]) - math.exp(lps[1]))
    return float(1.0 - np.mean(margins)) if margins else float("nan")


def exact_match_rate(primary: str, samples: list[str]) -> float:
    """1 - share of the samples whose text equals the primary's, character for character."""
    if not samples:
        return float("nan")
    return float(1.0 - np.mean([s == primary for s in samples]))


def _norm_prob(mean_logprob: float | None) -> float:
    return math.exp(mean_logprob) if mean_logprob is not None else float("nan")


def monte_carlo_probability(mean_logprobs: list[float | None]) -> float:
    """1 - mean of exp(mean token logprob) over the primary and the samples (an answer without
    logprobs counts as nan: the score is nan)."""
    if not mean_logprobs:
        return float("nan")
    return float(1.0 - np.mean([_norm_prob(m) for m in mean_logprobs]))


def consistency_confidence(
    primary_emb: np.ndarray, sample_embs: np.ndarray, primary_mean_logprob: float | None
) -> float:
    """1 - mean_k (1 + cos(primary, sample_k)) / 2 x exp(mean token logprob of the primary)."""
    if len(sample_embs) == 0:
        return float("nan")
    cos = np.asarray(sample_embs, np.float64) @ np.asarray(primary_emb, np.float64)
    return float(1.0 - np.mean(0.5 + cos / 2.0) * _norm_prob(primary_mean_logprob))

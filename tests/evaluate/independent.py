"""An independent re-implementation of the text methods, written from docs/evaluation.md alone.

It imports nothing from ``evaluation``: it reads the exports of
docs/exports.md with ``json``, re-derives each score from the method table of
docs/evaluation.md and measures AUROC with scikit-learn. tests/evaluate/test_independent.py and
bench/bench_evaluate_independent.py compare it with ``orchestrator evaluate``'s report; a
figure outside the report's bootstrap interval is a bug in one of the two (or an ambiguity of
the docs).
"""

from __future__ import annotations

import json
import math
import re
import string
from collections import Counter
from pathlib import Path

import numpy as np

__all__ = ["METHODS", "independent_scores", "independent_aurocs"]

METHODS = ("logprob_min", "logprob_mean", "logprob_sum", "logprob_last", "perplexity",
           "selfcheck_unigram", "selfcheck_unigram_max", "se_discrete_exact",
           "se_weighted_exact", "semantic_energy_exact")


def _read(path: Path) -> dict[str, dict]:
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                out[row["prompt_id"]] = row
    return out


def _squad_normalise(s: str) -> str:
    # SQuAD v1.1 evaluation script: lower, drop punctuation, drop articles, fix white space
    s = s.lower()
    s = "".join(c for c in s if c not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _clusters(texts: list[str]) -> list[str]:
    return [_squad_normalise(t) for t in texts]


def _entropy_of_counts(counts) -> float:
    n = sum(counts)
    return -sum(c / n * math.log(c / n) for c in counts)


def _selfcheck(primary: str, samples: list[str]) -> tuple[float, float]:
    tok = lambda t: re.findall(r"\w+", t.lower())  # noqa: E731
    words = tok(primary)
    counts = Counter(words)
    for s in samples:
        counts.update(tok(s))
    n, v = sum(counts.values()), len(counts)
    nlp = [-math.log((counts[w] + 1) / (n + v)) for w in words]
    if not nlp:
        return math.nan, math.nan
    return sum(nlp) / len(nlp), max(nlp)


def _weighted_se(keys: list[str], mean_lps: list[float]) -> float:
    per: dict[str, list[float]] = {}
    for k, lp in zip(keys, mean_lps):
        per.setdefault(k, []).append(lp)
    log_p = {k: np.logaddexp.reduce(np.array(v)) for k, v in per.items()}
    z = np.logaddexp.reduce(np.array(list(log_p.values())))
    p = np.exp(np.array(list(log_p.values())) - z)
    return float(-(p * np.log(p)).sum())


def _energy(answers: list[dict]) -> float:
    # answers[0] is the primary; energy of an answer = mean over its tokens of -logit
    e = [-float(np.mean(a["token_logits"])) for a in answers]
    keys = _clusters([a["text"] for a in answers])
    return sum(ei for ei, k in zip(e, keys) if k == keys[0]) / len(answers)


def independent_scores(root: Path | str) -> tuple[list[str], np.ndarray, dict[str, np.ndarray]]:
    """(prompt ids, labels, {method: scores}) of the labelled prompts, higher = hallucinated."""
    ex = Path(root) / "consolidated" / "exports"
    lp = _read(ex / "logprob_inputs.jsonl")
    sc = _read(ex / "selfcheck_samples.jsonl")
    se = _read(ex / "semantic_entropy_inputs.jsonl")
    en = _read(ex / "semantic_energy_inputs.jsonl")
    ids = sorted(p for p, r in lp.items() if r.get("label") in (0, 1))
    scores: dict[str, list[float]] = {m: [] for m in METHODS}
    for p in ids:
        t = [x for x in lp[p]["token_logprobs"] if x is not None]
        scores["logprob_min"].append(-min(t))
        scores["logprob_mean"].append(-sum(t) / len(t))
        scores["logprob_sum"].append(-sum(t))
        scores["logprob_last"].append(-t[-1])
        scores["perplexity"].append(math.exp(-sum(t) / len(t)))
        avg, mx = _selfcheck(sc[p]["primary"]["text"], [s["text"] for s in sc[p]["samples"]])
        scores["selfcheck_unigram"].append(avg)
        scores["selfcheck_unigram_max"].append(mx)
        keys = _clusters([s["text"] for s in se[p]["samples"]])
        scores["se_discrete_exact"].append(_entropy_of_counts(Counter(keys).values()))
        scores["se_weighted_exact"].append(
            _weighted_se(keys, [s["mean_logprob"] for s in se[p]["samples"]]))
        scores["semantic_energy_exact"].append(_energy(en[p]["samples"]))
    labels = np.array([lp[p]["label"] for p in ids])
    return ids, labels, {m: np.asarray(v, np.float64) for m, v in scores.items()}


def independent_aurocs(root: Path | str) -> dict[str, float]:
    """sklearn's AUROC of every method over the labelled prompts with a finite score."""
    from sklearn.metrics import roc_auc_score

    _, y, scores = independent_scores(root)
    out = {}
    for m, s in scores.items():
        ok = np.isfinite(s)
        out[m] = float(roc_auc_score(y[ok], s[ok]))
    return out

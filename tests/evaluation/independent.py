"""An independent re-implementation of the text methods, written from docs/evaluation.md alone.

It imports nothing from ``evaluation``: it reads the exports of
docs/exports.md with ``json``, re-derives each score from the method table of
docs/evaluation.md and measures AUROC with scikit-learn. tests/evaluation/test_independent.py and
bench/bench_evaluate_independent.py compare it with ``orchestrator evaluate``'s report; a
figure outside the report's bootstrap interval is a bug in one of the two (or an ambiguity of
the docs).
"""

from __future__ import annotations

import itertools
import json
import math
import re
import string
from collections import Counter
from pathlib import Path

import numpy as np

__all__ = ["METHODS", "independent_scores", "independent_aurocs"]

METHODS = (
    "logprob_min",
    "logprob_mean",
    "logprob_sum",
    "logprob_last",
    "perplexity",
    "selfcheck_unigram",
    "selfcheck_unigram_max",
    "se_discrete_exact",
    "se_weighted_exact",
    "semantic_energy_exact",
    "mean_token_entropy",
    "max_token_entropy",
    "ccp_lexical",
    "mc_sequence_entropy",
    "mc_normalized_sequence_entropy",
    "lexsim_rouge1",
    "lexsim_rouge2",
    "lexsim_rougeL",
    "num_sem_sets_exact",
    "eigval_laplacian_jaccard",
    "degmat_jaccard",
    "eccentricity_jaccard",
)


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


def _topk_entropy(top: list[dict]) -> float:
    lp = np.array([t["logprob"] for t in top])
    p = np.exp(lp) / np.exp(lp).sum()
    return float(-(p * np.log(p)).sum())


def _ccp(tokens: list[str], tops: list[list[dict]]) -> float:
    prod = 1.0
    for tok, top in zip(tokens, tops):
        mass = np.exp([t["logprob"] for t in top])
        same = sum(
            m for m, t in zip(mass, top) if t["token"].strip().lower() == tok.strip().lower()
        )
        prod *= same / mass.sum()
    return 1.0 - prod


def _rouge(texts: list[str], metric: str) -> float:
    from rouge_score import rouge_scorer  # Google's package, what LM-Polygraph calls

    scorer = rouge_scorer.RougeScorer([metric], use_stemmer=True)
    sims = [scorer.score(a, b)[metric].fmeasure for a, b in itertools.combinations(texts, 2)]
    return -float(np.mean(sims))


def _graph(texts: list[str]) -> tuple[float, float, float]:
    from scipy.linalg import eigh

    m = len(texts)
    words = [set(t.lower().split()) for t in texts]
    w = np.array(
        [
            [
                1.0
                if i == j
                else (
                    len(words[i] & words[j]) / len(words[i] | words[j])
                    if words[i] | words[j]
                    else 0.0
                )
                for j in range(m)
            ]
            for i in range(m)
        ]
    )
    degree = w.sum(axis=1)
    inv_sqrt = np.diag(degree**-0.5)
    lap = np.eye(m) - inv_sqrt @ w @ inv_sqrt
    lam, vec = eigh(lap)
    eigv = sum(max(0.0, 1.0 - v) for v in lam)
    deg = np.trace(m * np.eye(m) - np.diag(degree)) / m**2
    emb = vec[:, lam < 0.9]  # answer j embedded as row j
    ecc = float(np.sqrt(((emb - emb.mean(axis=0)) ** 2).sum()))
    return round(eigv, 12), round(deg, 12), round(ecc, 12)  # docs: 12 decimals


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
            _weighted_se(keys, [s["mean_logprob"] for s in se[p]["samples"]])
        )
        scores["semantic_energy_exact"].append(_energy(en[p]["samples"]))
        tops = lp[p]["top_logprobs"]
        ents = [_topk_entropy(top) for top in tops]
        scores["mean_token_entropy"].append(float(np.mean(ents)))
        scores["max_token_entropy"].append(float(np.max(ents)))
        scores["ccp_lexical"].append(_ccp(lp[p]["tokens"], tops))
        seq_lp = [sum(x["token_logprobs"]) for x in se[p]["samples"]]
        lens = [len(x["token_logprobs"]) for x in se[p]["samples"]]
        scores["mc_sequence_entropy"].append(-float(np.mean(seq_lp)))
        scores["mc_normalized_sequence_entropy"].append(
            -float(np.mean([a / n for a, n in zip(seq_lp, lens)]))
        )
        texts = [x["text"] for x in se[p]["samples"]]
        for metric in ("rouge1", "rouge2", "rougeL"):
            scores[f"lexsim_{metric}"].append(_rouge(texts, metric))
        scores["num_sem_sets_exact"].append(float(len(set(keys))))
        eigv, deg, ecc = _graph(texts)
        scores["eigval_laplacian_jaccard"].append(eigv)
        scores["degmat_jaccard"].append(deg)
        scores["eccentricity_jaccard"].append(ecc)
    labels = np.array([lp[p]["label"] for p in ids])
    return ids, labels, {m: np.asarray(v, np.float64) for m, v in scores.items()}


def independent_eigenscore(root: Path | str) -> tuple[list[str], np.ndarray]:
    """EigenScore of every labelled prompt: the last stored row of each of its K samples at the
    middle stored layer, (1/K) sum log eig(Z J Z^T + 1e-3 I), J = I - 11^T/d."""
    from hallulog.storage import open_store

    cons = Path(root) / "consolidated"
    lp = _read(cons / "exports" / "logprob_inputs.jsonl")
    ids = sorted(p for p, r in lp.items() if r.get("label") in (0, 1))
    keys: dict[str, list[str]] = {}
    with open(cons / "activation_index.jsonl") as f:
        for line in f:
            r = json.loads(line)
            if r["sample_id"] != 0:
                keys.setdefault(r["prompt_id"], []).append(r["activation_key"])
    reader = open_store(cons)
    layer = reader.num_layers // 2
    out = []
    for p in ids:
        z = np.stack(
            [np.asarray(reader.read(reader.index_of(k), layer)[-1], np.float64) for k in keys[p]]
        )
        d = z.shape[1]
        j = np.eye(d) - np.ones((d, d)) / d
        lam = np.linalg.eigvalsh(z @ j @ z.T + 1e-3 * np.eye(len(z)))
        out.append(float(np.mean(np.log(np.where(lam > 0, lam, 1e-10)))))
    reader.close()
    return ids, np.asarray(out)


def independent_aurocs(root: Path | str) -> dict[str, float]:
    """sklearn's AUROC of every method over the labelled prompts with a finite score."""
    from sklearn.metrics import roc_auc_score

    _, y, scores = independent_scores(root)
    out = {}
    for m, s in scores.items():
        ok = np.isfinite(s)
        out[m] = float(roc_auc_score(y[ok], s[ok]))
    return out


def _folds(ids: list[str], labels: np.ndarray, seed: int = 0, k: int = 5) -> np.ndarray:
    """Docs, Protocol: each class in order of sha256("{seed}:{prompt_id}"), dealt round-robin."""
    import hashlib

    key = [int.from_bytes(hashlib.sha256(f"{seed}:{p}".encode()).digest()[:8], "big") for p in ids]
    fold = np.zeros(len(ids), int)
    for c in (0, 1):
        members = sorted((key[i], i) for i in range(len(ids)) if labels[i] == c)
        for j, (_, i) in enumerate(members):
            fold[i] = j % k
    return fold


def _density_scores(method: str, x_tr, y_tr, x_te) -> np.ndarray:
    from sklearn.covariance import LedoitWolf
    from sklearn.metrics import roc_auc_score

    if method in ("mahalanobis_last", "rel_mahalanobis_last"):
        md = LedoitWolf().fit(x_tr[y_tr == 0]).mahalanobis(x_te)
        if method == "mahalanobis_last":
            return md
        return md - LedoitWolf().fit(x_tr).mahalanobis(x_te)
    # haloscope_last: (1/k) sum_j sigma_j <x - mu, v_j>^2 over the top k = 5 singular pairs
    mu = x_tr.mean(axis=0)
    lam, vec = np.linalg.eigh((x_tr - mu).T @ (x_tr - mu))
    top = np.argsort(lam)[::-1][:5]
    sigma, v = np.sqrt(np.maximum(lam[top], 0)), vec[:, top]

    def score(x):
        return (((x - mu) @ v) ** 2 * sigma).sum(axis=1) / 5

    sign = 1.0 if roc_auc_score(y_tr, score(x_tr)) >= 0.5 else -1.0
    return sign * score(x_te)


def _saplma(x_tr, y_tr, x_te) -> np.ndarray:
    # MLP 256-128-64 (ReLU, Adam, 100 iterations, seed 0) on float32 rows standardised with
    # the training fold's mean and standard deviation (+ 1e-6)
    import warnings

    from sklearn.neural_network import MLPClassifier

    x_tr, x_te = x_tr.astype(np.float32), x_te.astype(np.float32)
    mu, sd = x_tr.mean(axis=0), x_tr.std(axis=0) + np.float32(1e-6)
    clf = MLPClassifier(hidden_layer_sizes=(256, 128, 64), max_iter=100, random_state=0)
    from threadpoolctl import threadpool_limits

    with warnings.catch_warnings(), threadpool_limits(limits=1):  # BLAS threads only contend
        warnings.simplefilter("ignore")
        clf.fit((x_tr - mu) / sd, y_tr)
        return clf.predict_proba((x_te - mu) / sd)[:, 1].astype(np.float64)


def independent_probe_per_layer(
    root: Path | str, method: str, seed: int = 0, k: int = 5
) -> list[float]:
    """Out-of-fold AUROC at every stored layer of ``mahalanobis_last``,
    ``rel_mahalanobis_last``, ``haloscope_last`` or ``saplma_last`` (NaN at the layers it
    skips) on the last stored row of each labelled primary answer (runs without named
    positions)."""
    from threadpoolctl import threadpool_limits

    geo = _read(Path(root) / "consolidated" / "exports" / "geometry_inputs.jsonl")
    ids = sorted(p for p, r in geo.items() if r.get("label") in (0, 1))
    y = np.array([geo[p]["label"] for p in ids])

    with threadpool_limits(limits=1):  # small matrices: BLAS threads only contend
        return _probe_per_layer(root, method, ids, y, _folds(ids, y, seed, k), k)


def _probe_per_layer(root, method, ids, y, fold, k) -> list[float]:
    from hallulog.storage import open_store
    from sklearn.metrics import roc_auc_score

    geo = _read(Path(root) / "consolidated" / "exports" / "geometry_inputs.jsonl")
    reader = open_store(Path(root) / "consolidated")
    n_layers = reader.num_layers
    upper = {round(q * (n_layers - 1)) for q in (0.5, 0.625, 0.75, 0.875, 1.0)}
    out = []
    for li in range(n_layers):
        if method == "saplma_last" and li not in upper:
            out.append(float("nan"))
            continue
        x = np.stack(
            [
                np.asarray(
                    reader.read(reader.index_of(geo[p]["activation_key"]), li)[
                        geo[p]["num_rows"] - 1
                    ],
                    np.float64,
                )
                for p in ids
            ]
        )
        oof = np.zeros(len(ids))
        for f in range(k):
            te = fold == f
            oof[te] = (
                _saplma
                if method == "saplma_last"
                else lambda a, b, c: _density_scores(method, a, b, c)
            )(x[~te], y[~te], x[te])
        out.append(float(roc_auc_score(y, oof)))
    reader.close()
    return out

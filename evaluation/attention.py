"""The attention-based detectors, read from the run's attention summaries
(``--attention-features``, docs/formats/attention.md; row ``t`` of an answer is the decode step
that chose token ``t``, its query the token before it).

- ``lookback_lens`` (Chuang et al., 2024): per head, the lookback ratio of row t >= 1,
  (context / P) / (context / P + generated / t), averaged over the answer's rows; a logistic
  regression on the layers x heads ratios (the paper's span-level classifier, the span being
  the whole answer).
- ``rauq`` (Vazhentsev et al., 2025; LM-Polygraph's ``RAUQ``, whose definition it follows):
  per layer of the middle third, the head with the highest mean attention to the previous
  token; the confidence recurrence c_0 = p_0, c_j = alpha p_j + (1 - alpha) a_j c_{j-1} over
  the answer's T tokens, a_j the attention of the decode step that chose token j to token j - 1
  (its query: the row's ``self``; LM-Polygraph's ``attention_all[j, j - 1]``); the layer's
  uncertainty 1 - mean log c; the score is the largest over those layers.
  alpha = 0.5 for instruction-tuned models (the model's name says ``instruct``), 0.2 otherwise.
- ``attention_score`` (Sriramanan et al., 2024, LLM-Check): minus the mean over the answer's
  tokens and the heads of log A[q, q], at the middle layer (LM-Polygraph's default layer).
- ``lap_eigvals`` (Binkowski et al., 2025): per layer and head the top-``LAP_K`` diagonal values
  of the Laplacian (its eigenvalues: the matrix is lower triangular) over the answer's rows, a
  logistic regression on them.

Memory: one part of the store at a time; kept per labelled prompt, its feature vectors.
"""

from __future__ import annotations

import math

import numpy as np
from hallulog.contracts import layout
from hallulog.evaluation.data import iter_jsonl
from hallulog.evaluation.hidden_methods import HiddenContext, HiddenMethod, HiddenResult
from hallulog.storage.attention_format import FEATURES, has_attention, iter_generations

__all__ = ["METHODS", "LAP_K", "lookback_ratios", "rauq_score", "lap_topk", "attention_score"]

LAP_K = 10
CONTEXT, GENERATED, PREVIOUS, SELF, LAPLACIAN = range(len(FEATURES))


def lookback_ratios(f: np.ndarray, prompt_tokens: int) -> np.ndarray:
    """Per layer and head ``[L, H]``: the lookback ratio averaged over rows t >= 1 (1 when the
    answer has one token: nothing generated to look at yet)."""
    if len(f) < 2:
        return np.ones(f.shape[1:3])
    t = np.arange(1, len(f))[:, None, None]
    ctx = f[1:, :, :, CONTEXT] / prompt_tokens
    new = f[1:, :, :, GENERATED] / t
    return (ctx / np.maximum(ctx + new, 1e-12)).mean(0)


def rauq_layers(num_layers: int) -> list[int]:
    """LM-Polygraph's middle third: ``L // 3 .. ceil(2 L / 3)``, within the model."""
    return [i for i in range(num_layers // 3, math.ceil(num_layers / 3 * 2) + 1) if i < num_layers]


def rauq_score(f: np.ndarray, logprobs: np.ndarray, alpha: float) -> float:
    """RAUQ of one answer: ``f`` its summaries (row t: the decode step that chose token t),
    ``logprobs`` its tokens' log-probabilities; every token is read."""
    n = min(len(f), len(logprobs))
    if n < 1:
        return float("nan")
    p = np.exp(np.asarray(logprobs[:n], np.float64))
    prev = f[1:n, :, :, SELF].astype(np.float64)  # a_j of token j = 1 .. n - 1
    worst = -np.inf
    for layer in rauq_layers(f.shape[1]):
        head = int(prev[:, layer].mean(0).argmax()) if len(prev) else 0
        c = [p[0]]
        for j in range(1, n):
            c.append(alpha * p[j] + (1 - alpha) * prev[j - 1, layer, head] * c[-1])
        worst = max(worst, 1 - float(np.log(np.maximum(c, 1e-300)).mean()))
    return worst


def attention_score(f: np.ndarray) -> float:
    """Minus the mean log self-attention of the answer's tokens (rows t >= 1) over the heads,
    at the middle layer; NaN for a one-token answer."""
    if len(f) < 2:
        return float("nan")
    return -float(np.log(f[1:, f.shape[1] // 2, :, SELF].astype(np.float64) + 1e-12).mean())


def lap_topk(f: np.ndarray, k: int = LAP_K) -> np.ndarray:
    """``[L * H * k]``: per layer and head the ``k`` largest Laplacian diagonal values (0 where
    the answer has fewer rows)."""
    lap = np.sort(f[:, :, :, LAPLACIAN], axis=0)[::-1][:k]  # [<=k, L, H]
    out = np.zeros((k, *lap.shape[1:]))
    out[: len(lap)] = lap
    return out.transpose(1, 2, 0).reshape(-1)


def _alpha(run) -> float:
    name = str(run.manifest().get("model") or "").lower()
    return 0.5 if "instruct" in name else 0.2


def _primary_logprobs(run, wanted: set[str]) -> dict[str, np.ndarray]:
    out = {}
    for _, row in iter_jsonl(run.consolidated / layout.GENERATIONS):
        if row.get("sample_id") == 0 and row["prompt_id"] in wanted:
            lps = [lp.get("logprob") for lp in row.get("logprobs") or []]
            out[row["prompt_id"]] = np.array([-9999.0 if v is None else v for v in lps])
    return out


def _features(run, prompt_ids: list[str]):
    """Per prompt (in ``prompt_ids`` order): lookback ratios, RAUQ, AttentionScore, top-k
    Laplacian values of its primary answer; NaN rows where the store lacks it."""
    where = {p: i for i, p in enumerate(prompt_ids)}
    logprobs = _primary_logprobs(run, set(where))
    alpha = _alpha(run)
    lookback = lap = None
    rauq = np.full(len(prompt_ids), np.nan)
    score = np.full(len(prompt_ids), np.nan)
    for g in iter_generations(run.root):
        i = where.get(g.prompt_id)
        if g.sample_id != 0 or i is None:
            continue
        f = g.features
        if lookback is None:
            lookback = np.full((len(prompt_ids), f.shape[1] * f.shape[2]), np.nan)
            lap = np.full((len(prompt_ids), f.shape[1] * f.shape[2] * LAP_K), np.nan)
        lookback[i] = lookback_ratios(f, g.prompt_tokens).reshape(-1)
        lap[i] = lap_topk(f)
        score[i] = attention_score(f)
        if g.prompt_id in logprobs:
            rauq[i] = rauq_score(f, logprobs[g.prompt_id], alpha)
    return {"lookback_lens": lookback, "lap_eigvals": lap, "rauq": rauq, "attention_score": score}


_cache: dict = {}


def _cached(run, prompt_ids: list[str]):
    key = (str(run.root), tuple(prompt_ids))
    if key not in _cache:
        _cache.clear()
        _cache[key] = _features(run, prompt_ids)
    return _cache[key]


def _check(ctx: HiddenContext) -> str | None:
    if not has_attention(ctx.run.root):
        return (
            f"{layout.attention_dir(ctx.run.root)} holds no attention summaries; rerun with "
            "--attention-features"
        )
    if ctx.train is not None and not has_attention(ctx.train.root):
        return f"the training run {ctx.train.root} holds no attention summaries"
    return None


def _unsupervised(name: str):
    def score(ctx: HiddenContext) -> HiddenResult:
        return HiddenResult(scores=_cached(ctx.run, list(ctx.feats.prompt_ids))[name])

    return score


def _probe(name: str):
    def score(ctx: HiddenContext) -> HiddenResult:
        from hallulog.evaluation.probes import fit_probe

        x = _cached(ctx.run, list(ctx.feats.prompt_ids))[name]
        out = np.full(len(ctx.labels), np.nan)
        if x is None:
            return HiddenResult(scores=out)
        ok = np.isfinite(x).all(1)
        if ctx.train is not None:
            from hallulog.evaluation.features import collect

            tf = collect(ctx.train, set())
            ya, _, _ = tf.arrays()
            xa = _features(ctx.train, list(tf.prompt_ids))[name]
            if xa is not None:
                ok_a = np.isfinite(xa).all(1)
                if ok_a.any() and ok.any():
                    out[ok] = fit_probe("logistic", xa[ok_a], ya[ok_a])(x[ok])
            return HiddenResult(scores=out)
        for train, test in ctx.split.folds():
            tr, te = train & ok, test & ok
            if tr.any() and te.any():
                out[te] = fit_probe("logistic", x[tr], ctx.labels[tr])(x[te])
        return HiddenResult(scores=out)

    return score


METHODS = [
    HiddenMethod(
        "lookback_lens", "attention", "probe", _check, _probe("lookback_lens"), probability=True
    ),
    HiddenMethod("rauq", "attention", "unsupervised", _check, _unsupervised("rauq")),
    HiddenMethod(
        "attention_score", "attention", "unsupervised", _check, _unsupervised("attention_score")
    ),
    HiddenMethod(
        "lap_eigvals", "attention", "probe", _check, _probe("lap_eigvals"), probability=True
    ),
]

"""ICR probe (Zhang et al., 2025, *ICR Probe*): how each layer's update of the residual stream
spreads over the tokens before it, as features of a small MLP.

The ICR score of token t at layer l is the Jensen-Shannon divergence between (a) the update
Delta = h_l(t) - h_{l-1}(t) projected on the hidden states of the tokens it may read,
w_s = <Delta, h_{l-1}(s)> / ||h_{l-1}(s)||, and (b) the attention of t over those tokens, each
standardised (mean 0, sample standard deviation 1) and put through a softmax. The probe reads
one ICR score per layer transition, averaged over the answer's tokens, and is the paper's MLP
(128-64-32).

Here no attention is stored, so (b) is uniform over the tokens (the paper's
``attention_uniform`` ablation), and the tokens read are the stored rows from the prompt's last
token (TBG) up to t (the paper takes the top 10 % attended tokens of the whole sequence): what
the ``integrated`` and ``full`` profiles store (every layer, every response row). Each answer
row t >= 1 of that range is one token; its features need no reference answer.

Memory: ``batch`` prompts' (layers, rows, hidden) slices at a time; the kept features are
(prompts, layers - 1) floats.
"""

from __future__ import annotations

import warnings

import numpy as np
from hallulog.evaluation.hidden_methods import HiddenContext, HiddenMethod, HiddenResult

__all__ = ["METHODS", "ICR_HIDDEN", "icr_scores", "icr_features"]

#: the ICR probe's MLP hidden layers (the paper's 128-64-32)
ICR_HIDDEN = (128, 64, 32)


def icr_scores(h: np.ndarray) -> np.ndarray:
    """ICR score of each answer row at each layer transition: ``h`` is (L, m, hidden), row 0 the
    TBG row; returns (L - 1, m - 1) (transition l - 1 -> l, answer row t = 1..m-1)."""
    h = np.asarray(h, np.float64)
    L, m, _ = h.shape
    if L < 2 or m < 2:
        return np.full((max(L - 1, 0), max(m - 1, 0)), np.nan)
    prev = h[:-1]
    delta = h[1:] - prev
    norms = np.linalg.norm(prev, axis=2) + 1e-8  # (L-1, m)
    w = np.einsum("ltd,lsd->lts", delta, prev) / norms[:, None, :]  # (L-1, t, s)
    t_idx = np.arange(m)
    allowed = t_idx[None, :] <= t_idx[:, None]  # s <= t
    cnt = allowed.sum(1)  # t + 1 tokens read by row t
    wm = np.where(allowed, w, 0.0)
    mean = wm.sum(2) / cnt
    dev = np.where(allowed, w - mean[..., None], 0.0)
    std = np.sqrt((dev**2).sum(2) / np.maximum(cnt - 1, 1))
    z = np.where(allowed, dev / np.maximum(std, 1e-8)[..., None], -np.inf)
    z = z - z.max(2, keepdims=True)
    p = np.exp(z)
    p /= p.sum(2, keepdims=True)
    u = np.where(allowed, 1.0 / cnt[:, None], 0.0)[None]  # uniform over s <= t
    mid = 0.5 * (p + u)
    with np.errstate(divide="ignore", invalid="ignore"):
        kl_p = np.where(allowed, p * np.log(p / mid), 0.0).sum(2)
        kl_u = np.where(allowed, u * np.log(u / mid), 0.0).sum(2)
    return (0.5 * kl_p + 0.5 * kl_u)[:, 1:]


def icr_features(reader, store_idx, first, last, *, batch: int = 32) -> np.ndarray:
    """(prompts, L - 1): each prompt's ICR score per transition averaged over its answer rows
    (rows ``first[p] + 1 .. last[p]``, ``first`` the TBG row); NaN where fewer than two rows."""
    from hallulog.storage.dtypes import BFLOAT16, to_float32

    wide = to_float32 if reader.dtype == BFLOAT16 else (lambda a: a)
    L = reader.num_layers
    out = np.full((len(store_idx), max(L - 1, 0)), np.nan)
    todo = [
        p
        for p in range(len(store_idx))
        if store_idx[p] >= 0 and first[p] >= 0 and last[p] > first[p]
    ]
    for start in range(0, len(todo), batch):
        chunk = todo[start : start + batch]
        slices = reader.read_pairs(
            [int(store_idx[p]) for p in chunk for _ in range(L)],
            [li for _ in chunk for li in range(L)],
        )
        for j, p in enumerate(chunk):
            rows = slices[j * L : (j + 1) * L]
            if min(len(a) for a in rows) <= last[p]:
                continue
            h = np.stack([wide(a[first[p] : last[p] + 1]) for a in rows])
            out[p] = icr_scores(h).mean(1)
        del slices
    return out


def _fit_predict(x_tr, y_tr, x_te, seed: int = 0) -> np.ndarray:
    from sklearn.neural_network import MLPClassifier
    from threadpoolctl import threadpool_limits

    if len(np.unique(y_tr)) < 2:
        return np.full(len(x_te), np.nan)
    mu, sd = x_tr.mean(0), x_tr.std(0) + 1e-6
    clf = MLPClassifier(hidden_layer_sizes=ICR_HIDDEN, max_iter=300, random_state=seed)
    # small matrices: BLAS threads only contend (15x slower on a loaded 2-core machine)
    with warnings.catch_warnings(), threadpool_limits(limits=1):
        warnings.simplefilter("ignore")
        clf.fit((x_tr - mu) / sd, y_tr)
    p = np.clip(clf.predict_proba((x_te - mu) / sd)[:, 1].astype(np.float64), 1e-12, 1 - 1e-12)
    return np.log(p) - np.log1p(-p)


def _inputs(run, feats, rows):
    from hallulog.evaluation.probes import store_index
    from hallulog.storage import open_store

    reader = open_store(run.consolidated)
    idx = np.array([store_index(reader, k) for k in feats.activation_keys], np.int64)
    return reader, idx, rows["tbg"], rows["last"]


def _check(ctx: HiddenContext) -> str | None:
    if not ctx.run.has_activations():
        return (
            f"{ctx.run.consolidated}/activations holds no activation store; rerun with "
            "--logging-profile integrated (every layer, every response row)"
        )
    tbg, last = ctx.rows["tbg"], ctx.rows["last"]
    ok = (tbg >= 0) & (last > tbg)
    if getattr(ctx.feats, "named_positions", False) or ok.mean() < 0.5:
        return (
            "needs every response row of the primary answer from the prompt's last token on "
            "(sequence_mode response or all), which this run did not store; rerun with "
            "--logging-profile integrated"
        )
    return None


def _score(ctx: HiddenContext) -> HiddenResult:
    reader, idx, first, last = _inputs(ctx.run, ctx.feats, ctx.rows)
    try:
        x = icr_features(reader, idx, first, last)
        layers = [int(v) for v in reader.layer_ids]
    finally:
        reader.close()
    ok = np.isfinite(x).all(1)
    out = np.full(len(x), np.nan)
    if ctx.train is not None:
        from hallulog.evaluation.features import collect

        tf = collect(ctx.train, set())
        ya, _, rows_a = tf.arrays()
        ra, idx_a, fa, la = _inputs(ctx.train, tf, rows_a)
        try:
            xa = icr_features(ra, idx_a, fa, la)
        finally:
            ra.close()
        ok_a = np.isfinite(xa).all(1)
        if ok_a.any() and ok.any():
            out[ok] = _fit_predict(xa[ok_a], ya[ok_a], x[ok], ctx.seed)
        return HiddenResult(scores=out, layers=layers)
    for train, test in ctx.split.folds():
        tr, te = train & ok, test & ok
        if tr.any() and te.any():
            out[te] = _fit_predict(x[tr], ctx.labels[tr], x[te], ctx.seed)
    return HiddenResult(scores=out, layers=layers)


METHODS = [HiddenMethod("icr_probe", "icr", "probe", _check, _score, probability=True)]

"""EigenScore (INSIDE; Chen et al., 2024): the spread of the K samples' internal states.

For each prompt the last stored row of each of its K sampled answers (the primary left out, as
the K samples of Semantic Entropy) is read at the middle stored layer (LM-Polygraph's choice);
with Z the ``(K, hidden)`` matrix, J_d = I - 1/d 11^T (each row centred over its features) and
alpha = 1e-3,

    EigenScore = (1/K) sum_i log(lambda_i),   lambda = eig(Z J_d Z^T + alpha I)

(eigenvalues <= 0 count as 1e-10), as LM-Polygraph's ``EigenScore``. Memory: one
``(samples, hidden)`` slice batch at a time.
"""

from __future__ import annotations

import numpy as np
from hallulog.evaluation.hidden_methods import HiddenMethod, HiddenResult

__all__ = ["EIGENSCORE_ALPHA", "METHODS", "eigenscore", "eigenscore_scores", "middle_layer"]

EIGENSCORE_ALPHA = 1e-3


def middle_layer(num_layers: int) -> int:
    """Index (into the stored layers) of the middle one."""
    return num_layers // 2


def eigenscore(z: np.ndarray, alpha: float = EIGENSCORE_ALPHA) -> float:
    z = np.asarray(z, np.float64)
    if len(z) < 2:
        return float("nan")
    zc = z - z.mean(1, keepdims=True)  # Z J_d: each row centred over features
    cov = zc @ zc.T + alpha * np.eye(len(z))
    vals = np.linalg.eigvalsh(cov)
    return float(np.mean(np.log(np.where(vals > 0, vals, 1e-10))))


def eigenscore_scores(
    reader, sample_keys: list[list[str]], *, batch: int = 256
) -> tuple[np.ndarray, int]:
    """EigenScore of every prompt (``sample_keys[p]``: its samples' activation keys) at the
    middle stored layer; (scores, layer id)."""
    from hallulog.storage.dtypes import BFLOAT16, to_float32

    wide = to_float32 if reader.dtype == BFLOAT16 else (lambda row: row)
    li = middle_layer(reader.num_layers)
    flat: list[tuple[int, int]] = []
    for p, keys in enumerate(sample_keys):
        for k in keys:
            try:
                flat.append((p, reader.index_of(k)))
            except KeyError:
                continue
    rows: dict[int, list[np.ndarray]] = {}
    for start in range(0, len(flat), batch):
        chunk = flat[start : start + batch]
        slices = reader.read_pairs([i for _, i in chunk], [li] * len(chunk))
        for (p, _), a in zip(chunk, slices):
            if len(a):
                rows.setdefault(p, []).append(np.asarray(wide(a[-1]), np.float32))
        del slices
    out = np.full(len(sample_keys), np.nan)
    for p, zs in rows.items():
        out[p] = eigenscore(np.stack(zs))
    return out, int(reader.layer_ids[li])


def _sample_keys(ctx) -> list[list[str]]:
    want = {p: i for i, p in enumerate(ctx.feats.prompt_ids)}
    keys: list[list[str]] = [[] for _ in ctx.feats.prompt_ids]
    for _, row in ctx.run.iter_activation_index():
        i = want.get(row.get("prompt_id"))
        if i is not None and row.get("sample_id") not in (0, None) and row.get("activation_key"):
            keys[i].append(row["activation_key"])
    return keys


def _check(ctx) -> str | None:
    if not ctx.run.has_activations():
        return (
            f"{ctx.run.consolidated}/activations holds no activation store; "
            "rerun with a logging profile that stores activations"
        )
    keys = _sample_keys(ctx)
    if sum(len(k) >= 2 for k in keys) < 0.5 * len(keys):
        return (
            "needs the stored rows of at least two sampled answers per prompt, but the run "
            "stored activations of the primary answers only; rerun with a profile that "
            "captures every sample"
        )
    return None


def _score(ctx) -> HiddenResult:
    from hallulog.storage import open_store

    reader = open_store(ctx.run.consolidated)
    try:
        scores, layer = eigenscore_scores(reader, _sample_keys(ctx))
    finally:
        reader.close()
    return HiddenResult(scores=scores, layer=layer)


METHODS = [HiddenMethod("eigenscore", "eigenscore", "unsupervised", _check, _score)]

"""Activation probes, per layer, read through the store in bounded memory.

Probes (definitions in docs/evaluation.md), all on the primary answer's stored rows:

- ``got_logistic_last`` / ``got_massmean_last``: Geometry of Truth (Marks & Tegmark, 2023),
  logistic regression and the mass-mean direction on the last stored row;
- ``sep_tbg`` / ``sep_slt``: Semantic Entropy Probes (Kossen et al., 2024), logistic regression
  trained on the binarised semantic entropy at the token before generation (TBG, the last
  prompt row) and the second-last token (SLT), scored against the correctness labels;
- ``lkm_exact_answer``: LLMs-Know-More (Orgad et al., 2024), logistic regression on the last
  token of the exact answer.

Memory: one layer at a time; per layer one ``(prompts, hidden)`` float32 matrix per row kind is
filled from ``read_pairs`` batches of at most ``batch`` samples (each a ``(seq_len, hidden)``
slice, one pread), so the peak is O(prompts x hidden), never the store.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass

import numpy as np

from .protocol import Split, auroc
from .semantic_entropy import binarize_threshold

__all__ = ["PROBES", "ProbeSpec", "run_probes"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbeSpec:
    name: str
    row: str            # which stored row: last | tbg | slt | exact
    kind: str           # logistic | massmean
    target: str         # label | se (binarised semantic entropy)
    family: str


PROBES = {
    p.name: p for p in [
        ProbeSpec("got_logistic_last", "last", "logistic", "label", "geometry"),
        ProbeSpec("got_massmean_last", "last", "massmean", "label", "geometry"),
        ProbeSpec("sep_tbg", "tbg", "logistic", "se", "sep"),
        ProbeSpec("sep_slt", "slt", "logistic", "se", "sep"),
        ProbeSpec("lkm_exact_answer", "exact", "logistic", "label", "lkm_probe"),
    ]
}

#: inverse L2 strength of the logistic probes (on standardised features); fixed, not tuned
LOGISTIC_C = 0.05


def _fit_predict(kind: str, x_tr: np.ndarray, y_tr: np.ndarray, x_te: np.ndarray) -> np.ndarray:
    if len(np.unique(y_tr)) < 2:
        return np.full(len(x_te), np.nan)
    if kind == "massmean":
        theta = x_tr[y_tr == 1].mean(0) - x_tr[y_tr == 0].mean(0)
        return x_te @ theta
    from sklearn.linear_model import LogisticRegression

    mu, sd = x_tr.mean(0), x_tr.std(0) + 1e-6
    clf = LogisticRegression(C=LOGISTIC_C, max_iter=200, tol=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf.fit((x_tr - mu) / sd, y_tr)
    return clf.decision_function((x_te - mu) / sd)


def _fill_layer(reader, layer: int, store_idx: np.ndarray, rows: dict[str, np.ndarray],
                batch: int) -> dict[str, np.ndarray]:
    """``{row kind: (prompts, hidden) float32}``; NaN rows where the kind is not stored."""
    from storage.dtypes import BFLOAT16, to_float32

    # bfloat16 rows widened exactly by a shift (numpy's cast of ml_dtypes goes element-wise)
    wide = to_float32 if reader.dtype == BFLOAT16 else (lambda row: row)
    n, h = len(store_idx), reader.hidden_size
    out = {k: np.full((n, h), np.nan, np.float32) for k in rows}
    have = np.flatnonzero(store_idx >= 0)
    for start in range(0, len(have), batch):
        chunk = have[start:start + batch]
        slices = reader.read_pairs(store_idx[chunk].tolist(), [layer] * len(chunk))
        for j, p in enumerate(chunk):
            a = slices[j]
            for k, r in rows.items():
                if 0 <= r[p] < len(a):
                    out[k][p] = wide(a[r[p]])
        del slices
    return out


def run_probes(reader, store_idx: np.ndarray, rows: dict[str, np.ndarray], labels: np.ndarray,
               se: np.ndarray | None, split: Split, probes: list[str], *,
               batch: int = 256) -> dict[str, dict]:
    """Per-layer out-of-fold scores of each probe and the layer-selected headline scores.

    Returns ``{probe: {layer_ids, per_layer_auroc, scores (selected layer per fold),
    selected_layers, coverage}}``.
    """
    import sklearn.linear_model  # noqa: F401  (load BLAS first: threadpoolctl caps loaded libraries)
    from threadpoolctl import threadpool_limits

    # small matrices: BLAS threads only contend (10x slower on a loaded 2-core machine)
    with threadpool_limits(limits=1):
        return _run_probes(reader, store_idx, rows, labels, se, split, probes, batch)


def _run_probes(reader, store_idx, rows, labels, se, split, probes, batch):
    specs = [PROBES[p] for p in probes]
    needed = {s.row: rows[s.row] for s in specs}
    n, L = len(labels), reader.num_layers
    oof = {s.name: np.full((L, n), np.nan) for s in specs}
    t0 = time.monotonic()
    for layer in range(L):
        feats = _fill_layer(reader, layer, store_idx, needed, batch)
        for s in specs:
            x = feats[s.row]
            ok = np.isfinite(x).all(1)
            if s.target == "se":
                if se is None:
                    continue
                ok &= np.isfinite(se)
            for train, test in split.folds():
                tr, te = train & ok, test & ok
                if not te.any() or not tr.any():
                    continue
                if s.target == "se":
                    y = (se[tr] > binarize_threshold(se[tr])).astype(int)
                else:
                    y = labels[tr]
                oof[s.name][layer, te] = _fit_predict(s.kind, x[tr], y, x[te])
        del feats
        log.info("probes: layer %d/%d done (%.1f s)", layer + 1, L, time.monotonic() - t0)
    out = {}
    test_mask = split.test_mask()
    for s in specs:
        scores = oof[s.name]
        per_layer = [auroc(labels[test_mask & np.isfinite(sc)], sc[test_mask & np.isfinite(sc)])
                     for sc in scores]
        chosen = np.full(n, np.nan)
        selected = []
        for test, sel in split.selection_masks():
            vals = []
            for sc in scores:
                m = sel & np.isfinite(sc)
                vals.append(auroc(labels[m], sc[m]) if m.any() else np.nan)
            vals = np.asarray(vals)
            if not np.isfinite(vals).any():
                selected.append(None)
                continue
            best = int(np.nanargmax(vals))
            selected.append(int(reader.layer_ids[best]))
            chosen[test] = scores[best, test]
        out[s.name] = {"layer_ids": [int(x) for x in reader.layer_ids],
                       "per_layer_auroc": per_layer, "scores": chosen,
                       "selected_layers": selected,
                       "coverage": float(np.isfinite(scores).any(0).mean())}
    return out

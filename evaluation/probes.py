"""Activation probes, per layer, read through the store in bounded memory.

Probes (definitions in docs/evaluation.md), all on the primary answer's stored rows:

- ``got_logistic_last`` / ``got_massmean_last``: Geometry of Truth (Marks & Tegmark, 2023),
  logistic regression and the mass-mean direction on the last stored row;
- ``sep_tbg`` / ``sep_slt``: Semantic Entropy Probes (Kossen et al., 2024), logistic regression
  trained on the binarised semantic entropy at the token before generation (TBG, the last
  prompt row) and the second-last token (SLT), scored against the correctness labels;
- ``lkm_exact_answer``: LLMs-Know-More (Orgad et al., 2024), logistic regression on the last
  token of the exact answer;
- ``saplma_last``: SAPLMA (Azaria & Mitchell, 2023), an MLP (256-128-64, ReLU) on the last row,
  at five layers from the middle to the top;
- ``mahalanobis_last`` / ``rel_mahalanobis_last``: Mahalanobis distance (Lee et al., 2018) of
  the last row to the Gaussian of the training fold's correct answers (Ledoit-Wolf covariance),
  and the relative Mahalanobis distance (Ren et al., 2021): minus the distance to the Gaussian
  of all training answers;
- ``haloscope_last``: HaloScope's membership score (Du et al., 2024): weighted squared
  projection on the top-k singular vectors of the centred training rows (labels unused but for
  the sign);
- ``layer_transition_last``: a layer-transition probe (PARALLAX, Hussain & Kantarcioglu, 2026):
  logistic regression on the update h_l - h_{l-1} between consecutive stored layers at the last
  row, one probe per transition;
- ``question_logistic_tbg`` / ``question_mlp_tbg``: question-side probes (HALT / DRIFT,
  Bhatnagar et al., 2026) on the prompt's last token (TBG), before any answer token: logistic
  regression at every layer, and an MLP at five intermediate layers.

Memory: one layer at a time; per layer one ``(prompts, hidden)`` float32 matrix per row kind is
filled from ``read_pairs`` batches of at most ``batch`` samples (each a ``(seq_len, hidden)``
slice, one pread), so the peak is O(prompts x hidden), never the store.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from hallulog.evaluation.protocol import Split, auroc
from hallulog.evaluation.semantic_entropy import binarize_threshold

__all__ = [
    "PROBES",
    "ProbeSpec",
    "PROBABILITY_PROBES",
    "run_probes",
    "run_transfer",
    "upper_layers",
    "middle_layers",
    "probe_layers",
    "fit_probe",
    "fill_layer",
    "store_index",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbeSpec:
    name: str
    row: str  # which stored row: last | tbg | slt | exact
    kind: str  # logistic | massmean
    target: str  # label | se (binarised semantic entropy)
    family: str
    layers: str = "all"  # all | upper (SAPLMA: five layers from the middle to the top) | middle
    feature: str = "state"  # state: the stored row | transition: row minus the previous layer's


PROBES = {
    p.name: p
    for p in [
        ProbeSpec("got_logistic_last", "last", "logistic", "label", "geometry"),
        ProbeSpec("got_massmean_last", "last", "massmean", "label", "geometry"),
        ProbeSpec("sep_tbg", "tbg", "logistic", "se", "sep"),
        ProbeSpec("sep_slt", "slt", "logistic", "se", "sep"),
        ProbeSpec("lkm_exact_answer", "exact", "logistic", "label", "lkm_probe"),
        ProbeSpec("saplma_last", "last", "mlp", "label", "saplma", "upper"),
        ProbeSpec("mahalanobis_last", "last", "mahalanobis", "label", "density"),
        ProbeSpec("rel_mahalanobis_last", "last", "rel_mahalanobis", "label", "density"),
        ProbeSpec("haloscope_last", "last", "haloscope", "label", "subspace"),
        ProbeSpec(
            "layer_transition_last",
            "last",
            "logistic",
            "label",
            "layer_transition",
            feature="transition",
        ),
        ProbeSpec("question_logistic_tbg", "tbg", "logistic", "label", "question_probe"),
        ProbeSpec("question_mlp_tbg", "tbg", "mlp", "label", "question_probe", "middle"),
    ]
}

#: probes whose score is the logit of P(hallucinated): ECE and Brier use sigmoid(score)
PROBABILITY_PROBES = frozenset(
    {
        "got_logistic_last",
        "lkm_exact_answer",
        "saplma_last",
        "layer_transition_last",
        "question_logistic_tbg",
        "question_mlp_tbg",
    }
)
#: SAPLMA's hidden layers (Azaria & Mitchell, 2023)
SAPLMA_HIDDEN = (256, 128, 64)
#: HaloScope: number of singular vectors of the membership score
HALOSCOPE_K = 5

#: inverse L2 strength of the logistic probes (on standardised features); fixed, not tuned
LOGISTIC_C = 0.05


def store_index(reader, key: str | None) -> int:
    """Index of activation ``key`` in the store, -1 when absent."""
    if not key:
        return -1
    try:
        return reader.index_of(key)
    except KeyError:
        return -1


def upper_layers(num_layers: int) -> list[int]:
    """Indices (into the stored layers) at 1/2, 5/8, 3/4, 7/8 and all of the depth."""
    return sorted({int(round(q * (num_layers - 1))) for q in (0.5, 0.625, 0.75, 0.875, 1.0)})


def middle_layers(num_layers: int) -> list[int]:
    """Indices (into the stored layers) at 1/4, 3/8, 1/2, 5/8 and 3/4 of the depth."""
    return sorted({int(round(q * (num_layers - 1))) for q in (0.25, 0.375, 0.5, 0.625, 0.75)})


def probe_layers(spec: ProbeSpec, num_layers: int) -> set[int]:
    """Indices of the stored layers a probe is fitted at (a transition needs a previous one)."""
    if spec.layers == "upper":
        out = set(upper_layers(num_layers))
    elif spec.layers == "middle":
        out = set(middle_layers(num_layers))
    else:
        out = set(range(num_layers))
    return out - {0} if spec.feature == "transition" else out


def _feature(spec: ProbeSpec, cur: dict, prev: dict | None) -> np.ndarray:
    """The probe's input at one layer: the stored row, or its update from the previous layer."""
    if spec.feature == "transition":
        return cur[spec.row] - prev[spec.row]
    return cur[spec.row]


def _gaussian(x: np.ndarray):
    """Mean and Ledoit-Wolf shrunk covariance (1 - a) S + a m I of the rows ``x`` (S the
    maximum-likelihood covariance, m = trace(S) / d, a sklearn's ``ledoit_wolf_shrinkage``)."""
    from sklearn.covariance import ledoit_wolf_shrinkage

    x = np.asarray(x, np.float64)
    mu = x.mean(0)
    xc = x - mu
    shrink = float(ledoit_wolf_shrinkage(xc, assume_centered=True))
    m = float((xc**2).sum() / xc.size)
    return mu, xc, shrink, m


def _mahalanobis(x: np.ndarray, g) -> np.ndarray:
    """Squared Mahalanobis distance of the rows ``x`` under ``_gaussian``'s covariance: through
    the Woodbury identity (an n x n solve, n the fitted rows) when n <= d, else a d x d solve."""
    mu, xc, shrink, m = g
    d = np.asarray(x, np.float64) - mu
    a, b, n = shrink * m, 1.0 - shrink, len(xc)
    if n < 2 or not a > 0:  # one fitted row, or rows without spread: no covariance to invert
        return np.full(len(d), np.nan)
    if b <= 0:
        return (d**2).sum(1) / a
    if n > xc.shape[1]:  # more rows than features: d x d
        cov = b * (xc.T @ xc) / n + a * np.eye(xc.shape[1])
        return np.einsum("ij,ij->i", d, np.linalg.solve(cov, d.T).T)
    u = d @ xc.T  # (rows, n)
    gram = xc @ xc.T + (n * a / b) * np.eye(n)
    return ((d**2).sum(1) - np.einsum("ij,ij->i", u, np.linalg.solve(gram, u.T).T)) / a


def _haloscope(x_tr, y_tr, x_te, k=HALOSCOPE_K):
    x_tr = x_tr.astype(np.float64)
    mu = x_tr.mean(0)
    _, sv, vt = np.linalg.svd(x_tr - mu, full_matrices=False)
    k = min(k, len(sv))

    def score(x):
        proj = (x.astype(np.float64) - mu) @ vt[:k].T
        return (proj**2 * sv[:k]).sum(1) / k

    sign = 1.0 if auroc(y_tr, score(x_tr)) >= 0.5 else -1.0
    return sign * score(x_te)


def fit_probe(kind: str, x_tr: np.ndarray, y_tr: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """A probe of ``kind`` fitted on ``(x_tr, y_tr)``: the function scoring new rows (NaN for
    every row when the training rows hold one class only)."""
    if len(np.unique(y_tr)) < 2:
        return lambda x: np.full(len(x), np.nan)
    if kind == "massmean":
        theta = x_tr[y_tr == 1].mean(0) - x_tr[y_tr == 0].mean(0)
        return lambda x: x @ theta
    if kind in ("mahalanobis", "rel_mahalanobis"):
        g0 = _gaussian(x_tr[y_tr == 0])
        if kind == "mahalanobis":
            return lambda x: _mahalanobis(x, g0)
        g = _gaussian(x_tr)
        return lambda x: _mahalanobis(x, g0) - _mahalanobis(x, g)
    if kind == "haloscope":
        return lambda x: _haloscope(x_tr, y_tr, x)
    mu, sd = x_tr.mean(0), x_tr.std(0) + 1e-6
    if kind == "mlp":
        from sklearn.neural_network import MLPClassifier

        clf = MLPClassifier(
            hidden_layer_sizes=SAPLMA_HIDDEN, activation="relu", max_iter=100, random_state=0
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            clf.fit((x_tr - mu) / sd, y_tr)

        def logit(x):
            p = np.clip(clf.predict_proba((x - mu) / sd)[:, 1].astype(np.float64), 1e-12, 1 - 1e-12)
            return np.log(p) - np.log1p(-p)

        return logit
    from sklearn.linear_model import LogisticRegression

    clf = LogisticRegression(C=LOGISTIC_C, max_iter=200, tol=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf.fit((x_tr - mu) / sd, y_tr)
    return lambda x: clf.decision_function((x - mu) / sd)


def _fit_predict(kind: str, x_tr: np.ndarray, y_tr: np.ndarray, x_te: np.ndarray) -> np.ndarray:
    return fit_probe(kind, x_tr, y_tr)(x_te)


def fill_layer(
    reader, layer: int, store_idx: np.ndarray, rows: dict[str, np.ndarray], batch: int
) -> dict[str, np.ndarray]:
    """``{row kind: (prompts, hidden) float32}``; NaN rows where the kind is not stored."""
    from hallulog.storage.dtypes import BFLOAT16, to_float32

    # bfloat16 rows widened exactly by a shift (numpy's cast of ml_dtypes goes element-wise)
    wide = to_float32 if reader.dtype == BFLOAT16 else (lambda row: row)
    n, h = len(store_idx), reader.hidden_size
    out = {k: np.full((n, h), np.nan, np.float32) for k in rows}
    have = np.flatnonzero(store_idx >= 0)
    for start in range(0, len(have), batch):
        chunk = have[start : start + batch]
        slices = reader.read_pairs(store_idx[chunk].tolist(), [layer] * len(chunk))
        for j, p in enumerate(chunk):
            a = slices[j]
            for k, r in rows.items():
                if 0 <= r[p] < len(a):
                    out[k][p] = wide(a[r[p]])
        del slices
    return out


def run_probes(
    reader,
    store_idx: np.ndarray,
    rows: dict[str, np.ndarray],
    labels: np.ndarray,
    se: np.ndarray | None,
    split: Split,
    probes: list[str],
    *,
    batch: int = 256,
) -> dict[str, dict]:
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
    fitted = {s.name: probe_layers(s, L) for s in specs}
    keep_prev = any(s.feature == "transition" for s in specs)
    prev = None
    for layer in range(L):
        feats = fill_layer(reader, layer, store_idx, needed, batch)
        for s in specs:
            if layer not in fitted[s.name]:
                continue
            x = _feature(s, feats, prev)
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
        prev = feats if keep_prev else None
        del feats
        log.info("probes: layer %d/%d done (%.1f s)", layer + 1, L, time.monotonic() - t0)
    out = {}
    test_mask = split.test_mask()
    for s in specs:
        scores = oof[s.name]
        per_layer = [
            auroc(labels[test_mask & np.isfinite(sc)], sc[test_mask & np.isfinite(sc)])
            for sc in scores
        ]
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
        out[s.name] = {
            "layer_ids": [int(x) for x in reader.layer_ids],
            "per_layer_auroc": per_layer,
            "scores": chosen,
            "selected_layers": selected,
            "coverage": float(np.isfinite(scores).any(0).mean()),
        }
    return out


def run_transfer(
    train: dict, test: dict, probes: list[str], *, batch: int = 256
) -> dict[str, dict]:
    """Probes fitted on every labelled prompt of one run and scored on another's.

    ``train`` / ``test``: ``{reader, store_idx, rows}``, ``train`` also ``labels``, ``se`` and
    ``split`` (its k-fold split). The layer of each probe is the one with the best out-of-fold
    AUROC on the training run (its own k-fold cross-fitting), so the test run's labels choose
    nothing; ``per_layer_auroc`` is measured on the test run (``test["labels"]``).
    """
    import sklearn.linear_model  # noqa: F401
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        return _run_transfer(train, test, probes, batch)


def _run_transfer(train, test, probes, batch):
    specs = [PROBES[p] for p in probes]
    needed_a = {s.row: train["rows"][s.row] for s in specs}
    needed_b = {s.row: test["rows"][s.row] for s in specs}
    ra, rb = train["reader"], test["reader"]
    ya, se, split = train["labels"], train["se"], train["split"]
    L = ra.num_layers
    na, nb = len(ya), len(test["labels"])
    oof = {s.name: np.full((L, na), np.nan) for s in specs}
    out_b = {s.name: np.full((L, nb), np.nan) for s in specs}
    fitted = {s.name: probe_layers(s, L) for s in specs}
    prev_a = prev_b = None
    for layer in range(L):
        fa = fill_layer(ra, layer, train["store_idx"], needed_a, batch)
        fb = fill_layer(rb, layer, test["store_idx"], needed_b, batch)
        for s in specs:
            if layer not in fitted[s.name]:
                continue
            xa, xb = _feature(s, fa, prev_a), _feature(s, fb, prev_b)
            ok_a, ok_b = np.isfinite(xa).all(1), np.isfinite(xb).all(1)
            if s.target == "se":
                if se is None:
                    continue
                ok_a &= np.isfinite(se)

            def target(mask, by_se=s.target == "se"):
                if by_se:
                    return (se[mask] > binarize_threshold(se[mask])).astype(int)
                return ya[mask]

            for tr, te in split.folds():
                tr, te = tr & ok_a, te & ok_a
                if te.any() and tr.any():
                    oof[s.name][layer, te] = _fit_predict(s.kind, xa[tr], target(tr), xa[te])
            if ok_a.any() and ok_b.any():
                out_b[s.name][layer, ok_b] = _fit_predict(s.kind, xa[ok_a], target(ok_a), xb[ok_b])
        prev_a, prev_b = fa, fb
    yb = test["labels"]
    result = {}
    for s in specs:
        sel = [
            auroc(ya[np.isfinite(sc)], sc[np.isfinite(sc)]) if np.isfinite(sc).any() else np.nan
            for sc in oof[s.name]
        ]
        per_layer = [
            auroc(yb[np.isfinite(sc)], sc[np.isfinite(sc)]) if np.isfinite(sc).any() else np.nan
            for sc in out_b[s.name]
        ]
        if not np.isfinite(sel).any():
            chosen, best = np.full(nb, np.nan), None
        else:
            best = int(np.nanargmax(sel))
            chosen = out_b[s.name][best]
        result[s.name] = {
            "layer_ids": [int(x) for x in rb.layer_ids],
            "per_layer_auroc": per_layer,
            "scores": chosen,
            "selected_layers": [None if best is None else int(ra.layer_ids[best])],
            "coverage": float(np.isfinite(chosen).mean()) if nb else 0.0,
        }
    return result

"""``compare/paired.parquet``: one detector on two cells that asked the same prompts, compared
by a paired bootstrap.

Two cells are paired when their test prompts share prompt ids (the same dataset and split:
another seed, prompt template or model); the comparison runs over the shared prompts where
both cells' scores are finite, each cell with its own labels (its answers differ), on the same
resamples for both (``hallulog.evaluation.metrics.paired_differences`` with ``labels_b``). When
many cells share one prompt set, a cell's resampled AUROC and PRR are computed once per method
and reused for every pair it is in (equal to computing each pair afresh, tested), so the cost
grows with cells x methods, not with pairs x methods.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np
from hallulog.evaluation.metrics import (
    PAIRED_METRICS,
    difference_summary,
    paired_point,
    resampled_metrics,
)
from hallulog.evaluation.protocol import iter_resample_counts
from hallulog.study.table import CellScores

__all__ = ["PAIRED_COLUMNS", "shared_pairs", "paired_rows"]

#: paired.parquet's columns: name -> (Arrow type, meaning); docs/formats/study.md
PAIRED_COLUMNS = {
    "method": ("string", "the detector"),
    "cell_a": ("string", "the first cell (manifest / argument order)"),
    "cell_b": ("string", "the second cell"),
    "n": ("int64", "shared test prompts where both scores are finite"),
    "n_pos_a": ("int64", "of them hallucinated in cell a"),
    "n_pos_b": ("int64", "of them hallucinated in cell b"),
    **{
        col: ("float64", what)
        for m in PAIRED_METRICS
        for col, what in (
            (f"{m}_a", f"{m} of cell a on the shared prompts"),
            (f"{m}_b", f"{m} of cell b on the shared prompts"),
            (f"{m}_diff", f"{m} a - b"),
            (f"{m}_diff_lo", "its 95 % paired bootstrap interval, lower end"),
            (f"{m}_diff_hi", "upper end"),
            (f"{m}_p_le_0", "share of resamples where the difference is <= 0"),
        )
    },
    "seed": ("int64", "bootstrap seed"),
    "bootstrap": ("int64", "bootstrap resamples"),
}


def shared_pairs(cells: list[CellScores]) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
    """``(i, j, positions in cell i, positions in cell j)`` of every pair of cells whose test
    prompts share ids, the shared prompts in id order."""
    out = []
    for i in range(len(cells)):
        for j in range(i + 1, len(cells)):
            _, ia, ib = np.intersect1d(
                cells[i].test_ids, cells[j].test_ids, assume_unique=True, return_indices=True
            )
            if len(ia):
                out.append((i, j, ia, ib))
    return out


def _row(method, a: CellScores, b: CellScores, ya, yb, n_boot, seed, res=None) -> dict:
    row = {
        "method": method,
        "cell_a": a.name,
        "cell_b": b.name,
        "n": len(ya),
        "n_pos_a": int((ya == 1).sum()),
        "n_pos_b": int((yb == 1).sum()),
        "seed": seed,
        "bootstrap": n_boot,
    }
    for m in PAIRED_METRICS:
        if res is None:
            vals = dict.fromkeys(("a", "b", "diff", "diff_lo", "diff_hi", "p_le_0"), np.nan)
        else:
            pa, pb, d = res["a"][m], res["b"][m], res["diff"][m]
            vals = {
                "a": pa,
                "b": pb,
                "diff": d["diff"],
                "diff_lo": d["ci95"][0],
                "diff_hi": d["ci95"][1],
                "p_le_0": d["p_le_0"],
            }
        row.update({f"{m}_{k}": float(v) for k, v in vals.items()})
    return {k: row[k] for k in PAIRED_COLUMNS}


def paired_rows(
    cells: list[CellScores], methods: list[str], *, seed: int = 0, n_boot: int = 1000
) -> Iterator[dict]:
    """One row per (method, pair of cells sharing prompts)."""
    pairs = shared_pairs(cells)
    groups: dict[bytes, list] = {}
    for p in pairs:
        ids = cells[p[0]].test_ids[p[2]]
        groups.setdefault(hashlib.sha1(ids.tobytes()).digest(), []).append(p)
    for plist in groups.values():
        for method in methods:
            yield from _method_rows(cells, plist, method, n_boot, seed)


def _side(cache: dict, key: int | None, y, s, n_boot: int, seed: int) -> tuple:
    """(point metrics, resampled metrics) of one cell's scores; ``key``: cache it under the
    cell's index (its scores are finite on the group's whole shared set), None: do not."""
    if key is not None and key in cache:
        return cache[key]
    out = (paired_point(y, s), resampled_metrics(y, s, iter_resample_counts(len(y), n_boot, seed)))
    if key is not None:
        cache[key] = out
    return out


def _method_rows(cells: list[CellScores], plist: list, method: str, n_boot: int, seed: int):
    """The rows of one method over pairs sharing one prompt set."""
    cols: dict[int, np.ndarray] = {}
    cache: dict[int, tuple] = {}
    for i, j, ia, ib in plist:
        ca, cb = cells[i], cells[j]
        if method not in ca.methods or method not in cb.methods:
            continue
        for k in (i, j):
            if k not in cols:
                cols[k] = cells[k].column(method)
        a, b = cols[i][ia], cols[j][ib]
        ya, yb = ca.labels[ia], cb.labels[ib]
        ok = np.isfinite(a) & np.isfinite(b)
        whole = bool(ok.all())
        ya, yb, a, b = ya[ok], yb[ok], a[ok], b[ok]
        if not len(ya) or len(np.unique(ya)) < 2 or len(np.unique(yb)) < 2:
            yield _row(method, ca, cb, ya, yb, n_boot, seed)
            continue
        pa, va = _side(cache, i if whole else None, ya, a, n_boot, seed)
        pb, vb = _side(cache, j if whole else None, yb, b, n_boot, seed)
        diff = {m: difference_summary(pa[m], pb[m], va[m], vb[m]) for m in PAIRED_METRICS}
        res = {"a": pa, "b": pb, "diff": diff}
        yield _row(method, ca, cb, ya, yb, n_boot, seed, res)

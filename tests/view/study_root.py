"""A study root assembled from finished runs, in the layout the study command documents:
``study.json`` (``axes``; cells: ``name``, ``values``, ``root``; the roots here are absolute,
which the explorer also takes), ``compare/table.parquet`` (a row per cell × method:
cell, method, auroc, auroc_lo, auroc_hi, prr, computed from each run's
``evaluation/scores.parquet`` by hallulog's own ``summarize_scores``),
``compare/transfer.parquet`` (method, train_cell, test_cell, auroc) and a heatmap PNG drawn
from it. Every number comes from hallulog's metric code, none is typed in."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from hallulog.contracts import layout
from hallulog.evaluation.scores import read_scores, summarize_scores

__all__ = ["make_study", "compare_rows"]


def compare_rows(cell: str, root: Path) -> list[dict]:
    methods, _ = summarize_scores(read_scores(layout.evaluation_dir(root) / layout.SCORES))
    return [
        {
            "cell": cell,
            "method": m,
            "auroc": r["auroc"],
            "auroc_lo": r["ci95"][0],
            "auroc_hi": r["ci95"][1],
            "prr": (r.get("metrics") or {}).get("prr"),
            "prr_lo": ((r.get("metrics_ci95") or {}).get("prr") or [None, None])[0],
            "prr_hi": ((r.get("metrics_ci95") or {}).get("prr") or [None, None])[1],
        }
        for m, r in methods.items()
    ]


def make_study(
    study: Path,
    cells: dict[str, tuple[Path, dict]],
    transfer: Callable[[str, str, str], float],
    transfer_methods: list[str],
    name: str = "test study",
) -> Path:
    """``cells``: name → (run root, axis values); ``transfer(method, train, test)`` → AUROC.
    ``table.parquet`` holds the documented columns plus ``prr_lo``/``prr_hi``."""
    compare = layout.compare_dir(study)
    compare.mkdir(parents=True, exist_ok=True)
    doc = {
        "study_version": 1,
        "name": name,
        "axes": list(dict.fromkeys(k for _, axes in cells.values() for k in axes)),
        "cells": [
            {"name": cell, "values": axes, "root": str(root), "fingerprint": None}
            for cell, (root, axes) in cells.items()
        ],
    }
    (study / layout.STUDY_MANIFEST).write_text(json.dumps(doc, indent=1))
    rows = [r for name, (root, _) in cells.items() for r in compare_rows(name, root)]
    pq.write_table(pa.Table.from_pylist(rows), compare / layout.COMPARE_TABLE)
    grid = [
        {"method": m, "train_cell": a, "test_cell": b, "auroc": transfer(m, a, b)}
        for m in transfer_methods
        for a in cells
        for b in cells
    ]
    pq.write_table(pa.Table.from_pylist(grid), compare / layout.COMPARE_TRANSFER)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(cells)
    for m in transfer_methods:
        values = [[next(g["auroc"] for g in grid if g["method"] == m and g["train_cell"] == a
                        and g["test_cell"] == b) for b in names] for a in names]  # fmt: skip
        fig, ax = plt.subplots(figsize=(3, 3))
        ax.imshow(values, vmin=0, vmax=1, cmap="RdYlGn")
        ax.set_xticks(range(len(names)), names)
        ax.set_yticks(range(len(names)), names)
        ax.set_title(m)
        fig.savefig(compare / layout.transfer_heatmap(m), dpi=60)
        plt.close(fig)
    return study

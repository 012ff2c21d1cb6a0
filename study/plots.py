"""``compare/``'s heatmaps (matplotlib, Agg): method x cell per metric, train x test per probe."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from hallulog.contracts import layout

__all__ = ["heatmap", "table_heatmaps", "transfer_heatmaps", "method_order"]

#: metric -> (colour range, centre label) of the table heatmaps
_RANGES = {"auroc": (0.0, 1.0), "prr": (-1.0, 1.0)}


def heatmap(
    values: np.ndarray,
    rows: list[str],
    cols: list[str],
    *,
    title: str,
    path: Path,
    vmin: float,
    vmax: float,
    xlabel: str,
    ylabel: str,
) -> Path:
    """One annotated heatmap (NaN cells grey) written to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h, w = values.shape
    width, height = min(3.0 + 0.6 * w, 30), min(1.8 + 0.25 * h, 40)
    fig, ax = plt.subplots(figsize=(width, height))
    # margins from the labels' lengths (tight_layout's extra drawing pass costs ~12 MB here)
    left = min(0.6, (0.6 + 0.06 * max(map(len, rows), default=1)) / width)
    bottom = min(0.6, (0.5 + 0.045 * max(map(len, cols), default=1)) / height)
    fig.subplots_adjust(left=left, bottom=bottom, right=1 - 0.5 / width, top=1 - 0.45 / height)
    cmap = matplotlib.colormaps["RdYlGn"].with_extremes(bad="#d9d9d9")
    im = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    ax.set_xticks(range(w), cols, rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(h), rows, fontsize=7)
    if h * w <= 1500:
        for i in range(h):
            for j in range(w):
                v = values[i, j]
                if math.isfinite(v):
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, shrink=0.8, fraction=0.04)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def method_order(rows: list[dict]) -> list[str]:
    """Methods by their mean AUROC over the cells, best first (ties by name)."""
    by: dict[str, list[float]] = {}
    for r in rows:
        by.setdefault(r["method"], []).append(r["auroc"])
    mean = {m: np.nanmean(v) if np.isfinite(v).any() else -1.0 for m, v in by.items()}
    return sorted(mean, key=lambda m: (-mean[m], m))


def table_heatmaps(rows: list[dict], cells: list[str], out: Path) -> list[str]:
    """``auroc.png`` and ``prr.png``: methods down, cells across."""
    methods = method_order(rows)
    made = []
    for metric, name in layout.COMPARE_HEATMAPS.items():
        m = np.full((len(methods), len(cells)), np.nan)
        for r in rows:
            m[methods.index(r["method"]), cells.index(r["cell"])] = r[metric]
        vmin, vmax = _RANGES[metric]
        heatmap(
            m,
            methods,
            cells,
            title=f"{metric.upper()} per detector and cell",
            path=out / name,
            vmin=vmin,
            vmax=vmax,
            xlabel="cell",
            ylabel="detector",
        )
        made.append(name)
    return made


def transfer_heatmaps(rows: list[dict], cells: list[str], out: Path) -> list[str]:
    """``transfer_<probe>.png``: train cell down, test cell across (grey: not paired)."""
    made = []
    for probe in sorted({r["method"] for r in rows}):
        m = np.full((len(cells), len(cells)), np.nan)
        for r in rows:
            if r["method"] == probe:
                m[cells.index(r["train_cell"]), cells.index(r["test_cell"])] = r["auroc"]
        name = layout.transfer_heatmap(probe)
        heatmap(
            m,
            cells,
            cells,
            title=f"{probe}: AUROC, trained on (row) / tested on (column)",
            path=out / name,
            vmin=0.0,
            vmax=1.0,
            xlabel="test cell",
            ylabel="train cell",
        )
        made.append(name)
    return made

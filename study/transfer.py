"""``compare/transfer.parquet``: every probe trained on one cell and tested on another.

Cells are grouped by shape: the model of their run manifest, the stored layer ids and the
hidden size of their store (``hallulog.evaluation.transfer.run_shape``, the check of
``evaluate --train-root``); only cells of one group are paired, so cells of different models
never are. Within a group every ordered pair (A, B) gets the AUROC on B's labelled prompts of
each probe fitted on all of A's, at the layer A's k-fold out-of-fold AUROC chooses
(``hallulog.evaluation.transfer.transfer_scores``: the numbers of ``evaluate --train-root A
--test-root B``). The diagonal (A, A) is the in-domain figure the cell's own evaluation reports
(its table row). Memory: one layer of two cells' rows at a time, as ``evaluate``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from hallulog.evaluation.data import EvaluationInputError, Run
from hallulog.evaluation.probes import PROBES
from hallulog.evaluation.protocol import auroc, bootstrap_ci
from hallulog.evaluation.transfer import open_probe_cell, run_shape, transfer_scores
from hallulog.study.cells import CellRef

__all__ = ["TRANSFER_COLUMNS", "TransferStats", "shape_groups", "transfer_rows"]

log = logging.getLogger(__name__)

#: transfer.parquet's columns: name -> (Arrow type, meaning); docs/formats/study.md
TRANSFER_COLUMNS = {
    "method": ("string", "the probe"),
    "train_cell": ("string", "the cell it was fitted on"),
    "test_cell": ("string", "the cell it was scored on"),
    "model": ("string", "the model both cells ran"),
    "auroc": ("float64", "AUROC on the test cell's labelled prompts (diagonal: its table row)"),
    "auroc_lo": ("float64", "95 % percentile bootstrap interval over the test prompts, lower end"),
    "auroc_hi": ("float64", "upper end"),
    "n": ("int64", "test prompts with a finite score"),
    "n_pos": ("int64", "of them hallucinated"),
    "layer": ("int64", "the layer id chosen on the training cell (null on the diagonal)"),
    "in_domain": ("bool", "true on the diagonal (train cell = test cell: the cell's k-fold)"),
}


@dataclass
class TransferStats:
    """What the transfer pass did: pairs scored, seconds, cells left out and why."""

    pairs: int = 0
    seconds: float = 0.0
    groups: list[list[str]] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def shape_groups(cells: list[CellRef], stats: TransferStats) -> list[list[CellRef]]:
    """The cells grouped by (model, stored layers, hidden size), in cell order; a cell without
    an activation store is left out (``stats.skipped``)."""
    groups: dict[tuple, list[CellRef]] = {}
    for c in cells:
        run = Run(c.root)
        if not run.has_activations():
            stats.skipped[c.name] = "no activation store (probes cannot transfer)"
            continue
        shape = run_shape(run)
        key = (shape.get("model"), tuple(shape.get("layers") or ()), shape.get("hidden"))
        groups.setdefault(key, []).append(c)
    out = list(groups.values())
    stats.groups = [[c.name for c in g] for g in out]
    return out


def _diagonal(row: dict) -> dict:
    return {
        "method": row["method"],
        "train_cell": row["cell"],
        "test_cell": row["cell"],
        "model": row["model"],
        "auroc": row["auroc"],
        "auroc_lo": row["auroc_lo"],
        "auroc_hi": row["auroc_hi"],
        "n": row["n"],
        "n_pos": row["n_pos"],
        "layer": None,
        "in_domain": True,
    }


def transfer_rows(
    cells: list[CellRef],
    table: dict[tuple[str, str], dict],
    probes: list[str],
    *,
    seed: int = 0,
    folds: int = 5,
    n_boot: int = 1000,
    stats: TransferStats | None = None,
) -> Iterator[dict]:
    """The transfer matrix rows of ``probes`` over ``cells`` (those in the table): the
    diagonal from ``table`` (``{(cell, method): table row}``), the rest fitted and scored."""
    stats = stats if stats is not None else TransferStats()
    probes = [p for p in probes if p in PROBES]
    for group in shape_groups(cells, stats):
        for c in group:
            for p in probes:
                if (c.name, p) in table:
                    yield _diagonal(table[(c.name, p)])
        if len(group) < 2:
            continue
        opened = []
        for c in group:
            try:
                opened.append(
                    open_probe_cell(
                        c.name,
                        c.root,
                        seed=seed,
                        folds=folds,
                        row_kinds={PROBES[p].row for p in probes},
                        with_se=any(PROBES[p].target == "se" for p in probes),
                    )
                )
            except EvaluationInputError as exc:
                stats.skipped[c.name] = str(exc)
        for train in opened:
            mine = [p for p in probes if (train.name, p) in table]
            tests = [t for t in opened if t is not train]
            if not mine or not tests:
                continue
            t0 = time.monotonic()
            for test_name, p, scores, layer in transfer_scores(train, tests, mine):
                if (test_name, p) not in table:
                    continue  # the test cell's own evaluation could not score this probe
                test = next(t for t in tests if t.name == test_name)
                ok = np.isfinite(scores)
                y, s = test.labels[ok], scores[ok]
                lo, hi = bootstrap_ci(y, s, n_boot=n_boot, seed=seed)
                yield {
                    "method": p,
                    "train_cell": train.name,
                    "test_cell": test_name,
                    "model": table[(test_name, p)]["model"],
                    "auroc": auroc(y, s),
                    "auroc_lo": lo,
                    "auroc_hi": hi,
                    "n": int(ok.sum()),
                    "n_pos": int((y == 1).sum()),
                    "layer": layer,
                    "in_domain": False,
                }
            stats.pairs += len(tests)
            stats.seconds += time.monotonic() - t0
            log.info(
                "transfer: %s -> %d cells (%.1f s)",
                train.name,
                len(tests),
                time.monotonic() - t0,
            )

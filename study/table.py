"""``compare/table.parquet``: every detector x cell, from each cell's ``evaluation/scores.parquet``.

Each cell's scores file is read one column at a time (the prompt ids, labels and test mask once,
then one method's scores), and each method is summarised by the metric code ``evaluate`` uses
(``hallulog.evaluation.scores.summarize_method``) with the seed and bootstrap size the file
records, so a row's figures are the cell's own ``report.json`` figures. Detectors are never
run again and no activation is read. Methods are columns found by name: a method added to
``evaluate`` later is compared without a change here.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from hallulog.contracts import layout
from hallulog.contracts.jsonl import read_document
from hallulog.evaluation.data import EvaluationInputError
from hallulog.evaluation.scores import summarize_method
from hallulog.study.cells import CellRef, scores_path

__all__ = ["TABLE_COLUMNS", "CellScores", "open_cell_scores", "cell_rows", "FIXED_COLUMNS"]

log = logging.getLogger(__name__)

#: the scores file's columns that are not methods (besides the guard columns its metadata names,
#: ``leaked`` and ``label_<grader>``; a file whose metadata lists ``methods`` is read by that list)
FIXED_COLUMNS = ("prompt_id", "label", "fold", "test")

#: table.parquet's columns: name -> (Arrow type, meaning); docs/formats/study.md
TABLE_COLUMNS = {
    "cell": ("string", "the cell's name"),
    "method": ("string", "the detector (a column of the cell's scores.parquet)"),
    "family": ("string", "its family in `evaluate` (null for a method this version does not know)"),
    "model": ("string", "the run manifest's `model`"),
    "dataset": ("string", "the run manifest's `dataset`"),
    "n": ("int64", "test prompts with a finite score"),
    "n_pos": ("int64", "of them hallucinated (label 1)"),
    "auroc": ("float64", "AUROC"),
    "auroc_lo": ("float64", "its 95 % percentile bootstrap interval, lower end"),
    "auroc_hi": ("float64", "upper end"),
    "prr": ("float64", "prediction-rejection ratio"),
    "prr_lo": ("float64", "interval, lower end"),
    "prr_hi": ("float64", "upper end"),
    "pr_auc": ("float64", "PR-AUC with the hallucinated class positive (`pr_auc_hallucinated`)"),
    "pr_auc_lo": ("float64", "interval, lower end"),
    "pr_auc_hi": ("float64", "upper end"),
    "seed": ("int64", "bootstrap seed (the scores file's, or `--seed`)"),
    "bootstrap": ("int64", "bootstrap resamples (the scores file's, or `--bootstrap`)"),
}


@dataclass
class CellScores:
    """A cell's scores file, open: its test prompts (ids, labels, row positions in
    the file) and method columns; columns are read on demand."""

    name: str
    path: Path
    methods: list[str]
    probability: set[str]
    seed: int
    n_boot: int
    test_rows: np.ndarray
    test_ids: np.ndarray
    labels: np.ndarray
    model: str | None = None
    dataset: str | None = None

    def column(self, method: str) -> np.ndarray:
        """One method's scores on the test prompts (float64, NaN where it has none)."""
        col = _read(self.path, [method]).column(0)
        return col.to_numpy(zero_copy_only=False).astype(np.float64)[self.test_rows]


def _read(path: Path, columns: list[str]):
    """Columns of a scores file: memory-mapped, one thread (small reads; Arrow's thread pools
    keep memory per thread)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(path, memory_map=True).read(columns=columns, use_threads=False)


def _scheme(root: Path) -> str | None:
    report = read_document(layout.evaluation_dir(root) / layout.REPORT_JSON, "report")
    if isinstance(report, dict):
        return (report.get("protocol") or {}).get("scheme")
    return None


def open_cell_scores(cell: CellRef) -> CellScores:
    """A cell's scores; an evaluation of another run's probes (``--train-root``) is refused."""
    import pyarrow.parquet as pq

    if _scheme(cell.root) == "transfer":
        raise EvaluationInputError(
            f"{layout.evaluation_dir(cell.root)} holds a transfer evaluation (--train-root); "
            f"run `hallulog evaluate --artifact-root {cell.root}` on the cell itself"
        )
    path = scores_path(cell.root)
    schema = pq.read_schema(path, memory_map=True)
    meta = json.loads((schema.metadata or {}).get(b"hallulog.scores", b"{}"))
    head = _read(path, ["prompt_id", "label", "test"])
    test = head.column("test").to_numpy(zero_copy_only=False).astype(bool)
    rows = np.flatnonzero(test)
    ids = np.asarray(head.column("prompt_id").take(rows).to_pylist(), dtype=str)
    labels = head.column("label").to_numpy().astype(np.int64)[rows]
    manifest = cell.manifest()
    return CellScores(
        name=cell.name,
        path=path,
        methods=meta.get("methods")
        or [c for c in schema.names if c not in {*FIXED_COLUMNS, *meta.get("guards", [])}],
        probability=set(meta.get("probability", [])),
        seed=int(meta.get("seed", 0)),
        n_boot=int(meta.get("bootstrap", 1000)),
        test_rows=rows,
        test_ids=ids,
        labels=labels,
        model=None if manifest is None else manifest.get("model"),
        dataset=None if manifest is None else manifest.get("dataset"),
    )


def _nan(x) -> float:
    return float(x) if x is not None and math.isfinite(x) else float("nan")


def cell_rows(
    scores: CellScores,
    methods: list[str],
    *,
    families: dict[str, str],
    seed: int | None = None,
    n_boot: int | None = None,
) -> Iterator[dict]:
    """One table row per method of the cell (``methods``: those to compare, in order)."""
    seed = scores.seed if seed is None else seed
    n_boot = scores.n_boot if n_boot is None else n_boot
    for m in methods:
        if m not in scores.methods:
            continue
        r = summarize_method(
            scores.labels,
            scores.column(m),
            probability=m in scores.probability,
            n_boot=n_boot,
            seed=seed,
        )
        point, ci = r.get("metrics") or {}, r.get("metrics_ci95") or {}
        row = {
            "cell": scores.name,
            "method": m,
            "family": families.get(m),
            "model": scores.model,
            "dataset": scores.dataset,
            "n": int(r["n"]),
            "n_pos": int(r["n_hallucinated"]),
            "auroc": _nan(r["auroc"]),
            "auroc_lo": _nan(r["ci95"][0]),
            "auroc_hi": _nan(r["ci95"][1]),
            "seed": seed,
            "bootstrap": n_boot,
        }
        for key, src in (("prr", "prr"), ("pr_auc", "pr_auc_hallucinated")):
            lo, hi = ci.get(src, (None, None))
            row.update({key: _nan(point.get(src)), f"{key}_lo": _nan(lo), f"{key}_hi": _nan(hi)})
        yield {k: row[k] for k in TABLE_COLUMNS}

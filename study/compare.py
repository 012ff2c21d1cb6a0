"""``hallulog compare``: the table a paper reports, from cells already run and evaluated.

For each cell (a study's, or loose run roots): its state; an evaluated cell's scores file is
summarised per method (study/table.py); cells sharing prompts are compared by a paired
bootstrap (study/paired.py); the probes of cells of one model are trained on each and tested
on the others (study/transfer.py). Writes ``table.parquet``, ``paired.parquet``,
``transfer.parquet``, ``report.md`` and the heatmaps into the output directory
(``STUDY/compare/`` by default). A cell that is not run, not consolidated or not evaluated is
named and skipped, or (``evaluate_missing``) evaluated first by ``evaluate``'s own code.
"""

from __future__ import annotations

import logging
import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

from hallulog.contracts import layout
from hallulog.contracts.errors import HallulogError
from hallulog.study.cells import CellRef
from hallulog.study.paired import PAIRED_COLUMNS, paired_rows
from hallulog.study.report import compare_markdown
from hallulog.study.table import TABLE_COLUMNS, CellScores, cell_rows, open_cell_scores
from hallulog.study.transfer import TRANSFER_COLUMNS, TransferStats, transfer_rows

__all__ = ["CompareResult", "compare", "write_parquet"]

log = logging.getLogger(__name__)

_STATE_REASON = {
    "absent": "no run root yet (the study has not run this cell)",
    "running": "no consolidated method exports: the run is unfinished or failed (`hallulog run` "
    "resumes it, `hallulog consolidate` consolidates it)",
    "finished": "not evaluated: run `hallulog evaluate --artifact-root {root}`, or compare "
    "with --evaluate",
}


@dataclass
class CompareResult:
    out: Path
    cells: list[dict] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    table: list[dict] = field(default_factory=list)
    paired: list[dict] = field(default_factory=list)
    transfer: list[dict] = field(default_factory=list)
    transfer_stats: TransferStats | None = None
    plots: list[str] = field(default_factory=list)
    seconds: float = 0.0
    peak_rss_mib: float = 0.0


_ARROW = {"string": "string", "int64": "int64", "float64": "float64", "bool": "bool_"}


def write_parquet(rows: list[dict], columns: dict, path: Path) -> Path:
    """``rows`` as a Parquet file of exactly ``columns`` (name -> (type, meaning)), atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([(name, getattr(pa, _ARROW[t])()) for name, (t, _) in columns.items()])
    table = pa.Table.from_pylist(rows, schema=schema)
    tmp = path.with_name(path.name + ".partial")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return path


def _evaluate_cell(cell: CellRef, embeddings: bool, plots: bool) -> None:
    from hallulog.evaluation.cli import write_outputs
    from hallulog.evaluation.evaluate import evaluate

    log.warning("compare: evaluating %s (%s)", cell.name, cell.root)
    report = evaluate(cell.root, embeddings=embeddings)
    write_outputs(report, layout.evaluation_dir(cell.root), plots=plots)


def _open(cell: CellRef, result: CompareResult, evaluate_missing, embeddings, plots):
    """The cell's scores, or None (the reason in ``result.skipped``)."""
    state = cell.state
    info = {"name": cell.name, "values": cell.values, "root": str(cell.root), "state": state}
    result.cells.append(info)
    try:
        manifest = cell.manifest() if state != "absent" else None
        if manifest is not None:
            info.update(model=manifest.get("model"), dataset=manifest.get("dataset"))
            fp = manifest.config_fingerprint
            if cell.fingerprint and fp and fp != cell.fingerprint:
                result.warnings.append(
                    f"{cell.name}: the run's config fingerprint {fp[:12]} is not the study's "
                    f"{cell.fingerprint[:12]} (the cell was run with another config)"
                )
        if state == "finished" and evaluate_missing:
            _evaluate_cell(cell, embeddings, plots)
            state = info["state"] = cell.state
        if state != "evaluated":
            result.skipped[cell.name] = _STATE_REASON[state].format(root=cell.root)
            return None
        scores = open_cell_scores(cell)
    except HallulogError as exc:
        result.skipped[cell.name] = str(exc)
        return None
    info["test_prompts"] = len(scores.test_ids)
    return scores


def compare(
    cells: list[CellRef],
    out: Path | str,
    *,
    methods: list[str] | None = None,
    seed: int | None = None,
    n_boot: int | None = None,
    folds: int = 5,
    transfer: bool = True,
    transfer_methods: list[str] | None = None,
    evaluate_missing: bool = False,
    embeddings: bool = True,
    plots: bool = True,
) -> CompareResult:
    """Compare ``cells`` into ``out``. ``methods``: families or methods of ``evaluate``
    (default: every method a cell's scores hold). ``seed`` / ``n_boot``: the table's bootstrap
    (default: each cell's own, as its report) and the paired and transfer ones (default 0 and
    1000). ``folds``: the k-fold that chooses a transferred probe's layer; ``transfer_methods``:
    the probes (or families) of the transfer matrices (default: every probe compared)."""
    from hallulog.evaluation.evaluate import ALL_METHODS, resolve_methods
    from hallulog.evaluation.probes import PROBES

    t0 = time.monotonic()
    out = Path(out)
    wanted = resolve_methods(methods)[0] if methods else None
    transferred = set(resolve_methods(transfer_methods)[0]) if transfer_methods else None
    result = CompareResult(out=out)
    opened: list[tuple[CellRef, CellScores]] = []
    for cell in cells:
        scores = _open(cell, result, evaluate_missing, embeddings, plots)
        if scores is not None:
            opened.append((cell, scores))
    for name, why in result.skipped.items():
        log.warning("compare: skipped %s: %s", name, why)
    order: list[str] = []
    for _, s in opened:
        order += [m for m in s.methods if m not in order and (wanted is None or m in wanted)]
    for _, s in opened:
        result.table += cell_rows(s, order, families=ALL_METHODS, seed=seed, n_boot=n_boot)
    boot = 1000 if n_boot is None else n_boot
    base_seed = 0 if seed is None else seed
    result.paired = list(paired_rows([s for _, s in opened], order, seed=base_seed, n_boot=boot))
    if transfer:
        result.transfer_stats = TransferStats()
        by = {(r["cell"], r["method"]): r for r in result.table}
        probes = [m for m in order if m in PROBES and (transferred is None or m in transferred)]
        result.transfer = list(
            transfer_rows(
                [c for c, _ in opened],
                by,
                probes,
                seed=base_seed,
                folds=folds,
                n_boot=boot,
                stats=result.transfer_stats,
            )
        )
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob(layout.transfer_heatmap("*")), out / layout.COMPARE_TRANSFER]:
        stale.unlink(missing_ok=True)  # a former comparison's, not this one's
    write_parquet(result.table, TABLE_COLUMNS, out / layout.COMPARE_TABLE)
    write_parquet(result.paired, PAIRED_COLUMNS, out / layout.COMPARE_PAIRED)
    if transfer:
        write_parquet(result.transfer, TRANSFER_COLUMNS, out / layout.COMPARE_TRANSFER)
    names = [c for c, _ in opened]
    if plots and result.table:
        from hallulog.study.plots import table_heatmaps, transfer_heatmaps

        result.plots = table_heatmaps(result.table, [c.name for c in names], out)
        result.plots += transfer_heatmaps(result.transfer, [c.name for c in names], out)
    result.seconds = time.monotonic() - t0
    result.peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    tmp = out / (layout.REPORT_MD + ".partial")
    tmp.write_text(compare_markdown(result), encoding="utf-8")
    os.replace(tmp, out / layout.REPORT_MD)
    return result

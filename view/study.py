"""A study root: its cells (``study.json``), the compare table and the transfer matrices
(``compare/table.parquet``, ``compare/transfer.parquet``) and the heatmap PNGs of
``compare/``; each cell links to its run's pages.

Read as the study command documents its output: ``study.json`` holds ``axes`` (the axis names)
and ``cells``, each with a ``name``, its axis values (``values``: a scalar, or a table shown by
its ``name`` or as ``key=value`` pairs) and its run root (``root``, relative to the study root;
an absolute one is taken too); ``table.parquet`` has a row per cell × method with at least
``cell``, ``method``, ``auroc``, ``auroc_lo``, ``auroc_hi``, ``prr`` (``prr_lo``, ``prr_hi``,
``fpr_at_95``, ``fpr_at_95_lo``, ``fpr_at_95_hi`` when present); ``transfer.parquet`` has
``method``, ``train_cell``, ``test_cell``, ``auroc``. A missing piece is one line on the page.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hallulog.contracts import layout
from hallulog.contracts.jsonl import read_document
from hallulog.view.models import CompareValue, StudyCell, StudyPage, TransferMatrix
from hallulog.view.run_files import ViewInputError, open_run_files

__all__ = ["is_study", "StudyFiles", "open_study", "study_page"]

_PNG = re.compile(r"^[\w.-]+\.png$")
_TABLE_COLUMNS = ("cell", "method", "auroc", "auroc_lo", "auroc_hi", "prr")
_TABLE_OPTIONAL = ("prr_lo", "prr_hi", "fpr_at_95", "fpr_at_95_lo", "fpr_at_95_hi")
_TRANSFER_COLUMNS = ("method", "train_cell", "test_cell", "auroc")


def is_study(root: Path | str) -> bool:
    return (Path(root) / layout.STUDY_MANIFEST).is_file()


def _slug(name: str, taken: set[str]) -> str:
    base = re.sub(r"[^\w.-]+", "_", name).strip("._") or "cell"
    slug, i = base, 1
    while slug in taken:
        i += 1
        slug = f"{base}_{i}"
    taken.add(slug)
    return slug


@dataclass(frozen=True)
class StudyFiles:
    root: Path
    name: str | None
    axes: list[str]
    cells: list[StudyCell]
    roots: dict[str, Path]  # slug → run root
    table: Path | None
    transfer: Path | None
    plots: dict[str, Path] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)


def _shown(value: Any) -> str:
    """An axis value as a cell of the table: a table by its ``name``, else its pairs."""
    if isinstance(value, dict):
        if isinstance(value.get("name"), str):
            return value["name"]
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return "" if value is None else str(value)


def _cell_problem(root: Path) -> str | None:
    try:
        open_run_files(root)
    except ViewInputError as exc:
        return str(exc)
    return None


def open_study(root: Path | str) -> StudyFiles:
    root = Path(root)
    manifest = root / layout.STUDY_MANIFEST
    doc = read_document(manifest, "study manifest")
    if not isinstance(doc, dict) or not isinstance(doc.get("cells"), list):
        raise ViewInputError(f"{manifest}: no 'cells' list (rerun the study command)")
    cells, roots, taken = [], {}, set()
    for i, c in enumerate(doc["cells"]):
        if not isinstance(c, dict) or not c.get("name") or not c.get("root"):
            raise ViewInputError(f"{manifest}: cell {i} lacks a 'name' or a 'root'")
        run_root = Path(c["root"])
        run_root = run_root if run_root.is_absolute() else root / run_root
        slug = _slug(str(c["name"]), taken)
        values = c.get("values") if isinstance(c.get("values"), dict) else {}
        axes = {str(k): _shown(v) for k, v in values.items()}
        cells.append(
            StudyCell(
                name=str(c["name"]),
                slug=slug,
                axes=axes,
                root=str(run_root),
                problem=_cell_problem(run_root),
            )
        )
        roots[slug] = run_root
    compare = layout.compare_dir(root)
    table, transfer = compare / layout.COMPARE_TABLE, compare / layout.COMPARE_TRANSFER
    missing = []
    if not table.is_file():
        missing.append(f"{table} is missing: the study's compare step has not run")
    plots = (
        {p.name: p for p in sorted(compare.glob("*.png")) if _PNG.match(p.name)}
        if compare.is_dir()
        else {}
    )
    axes = doc.get("axes") if isinstance(doc.get("axes"), list) else []
    return StudyFiles(
        root=root,
        name=doc.get("name") if isinstance(doc.get("name"), str) else None,
        axes=[str(a) for a in axes],
        cells=cells,
        roots=roots,
        table=table if table.is_file() else None,
        transfer=transfer if transfer.is_file() else None,
        plots=plots,
        missing=missing,
    )


def _num(v: Any) -> float | None:
    return None if v is None or not math.isfinite(float(v)) else float(v)


def _read(
    path: Path, columns: tuple[str, ...], optional: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    have = pq.read_schema(path).names
    lacking = [c for c in columns if c not in have]
    if lacking:
        raise ViewInputError(f"{path}: no column(s) {lacking} (has {have})")
    wanted = [*columns, *(c for c in optional if c in have)]
    return pq.read_table(path, columns=wanted).to_pylist()


def study_page(files: StudyFiles) -> StudyPage:
    table: dict[str, dict[str, CompareValue]] = {}
    methods: list[str] = []
    if files.table is not None:
        for r in _read(files.table, _TABLE_COLUMNS, _TABLE_OPTIONAL):
            methods.append(r["method"])
            table.setdefault(str(r["cell"]), {})[r["method"]] = CompareValue(
                auroc=_num(r["auroc"]),
                auroc_lo=_num(r["auroc_lo"]),
                auroc_hi=_num(r["auroc_hi"]),
                prr=_num(r["prr"]),
                prr_lo=_num(r.get("prr_lo")),
                prr_hi=_num(r.get("prr_hi")),
                fpr_at_95=_num(r.get("fpr_at_95")),
                fpr_at_95_lo=_num(r.get("fpr_at_95_lo")),
                fpr_at_95_hi=_num(r.get("fpr_at_95_hi")),
            )
    transfer = []
    if files.transfer is not None:
        by_method: dict[str, dict[tuple[str, str], float | None]] = {}
        for r in _read(files.transfer, _TRANSFER_COLUMNS):
            by_method.setdefault(r["method"], {})[(r["train_cell"], r["test_cell"])] = _num(
                r["auroc"]
            )
        order = [c.name for c in files.cells]
        for method, values in by_method.items():
            train = [c for c in order if any(k[0] == c for k in values)]
            test = [c for c in order if any(k[1] == c for k in values)]
            transfer.append(
                TransferMatrix(
                    method=method,
                    train=train,
                    test=test,
                    auroc=[[values.get((a, b)) for b in test] for a in train],
                )
            )
    best = {m: max((v[m].auroc or 0.0) for v in table.values() if m in v) for m in methods}
    return StudyPage(
        root=str(files.root),
        name=files.name,
        axes=list(dict.fromkeys([*files.axes, *(k for c in files.cells for k in c.axes)])),
        cells=files.cells,
        methods=sorted(set(methods), key=lambda m: (-best[m], m)),
        table=table,
        transfer=transfer,
        plots=sorted(files.plots),
        missing=files.missing,
    )

"""Streaming readers of record files, in the layouts QA datasets are released in.

```python
from hallulog.tasks.base import MalformedCollector
from hallulog.tasks.records import iter_records, get_field, describe_where

collector = MalformedCollector("dev.jsonl", strict=False)
for at in iter_records("dev.jsonl", collector=collector):          # fmt="auto": by extension
    at.line, at.index, at.record                                    # 1-based line, 0-based index
for at in iter_records("train-v2.0.json", records_key="data", collector=collector): ...
for at in iter_records("saved_dataset/", split="validation", collector=collector): ...  # HF
get_field({"answers": {"text": ["x"]}}, "answers.text.0")          # -> "x"
```

Formats (``fmt``; ``"auto"`` goes by the extension, a directory is ``hf``, and a ``.json`` file
that holds one JSON object per line is ``jsonl``):

* ``jsonl`` (``.jsonl``, ``.ndjson``): one JSON object a line, streamed (``base.iter_jsonl``);
  ``line`` is the line.
* ``json`` (``.json``): one document, **held as text** (``records_json.JsonDocument``), its items
  decoded one at a time, never all at once; ``line`` is where the item starts.
* ``csv`` / ``tsv`` (``.csv`` / ``.tsv``): the ``csv`` module, header row, streamed; ``line`` is
  where the row starts (a quoted cell may span lines).
* ``parquet`` (``.parquet``): ``ParquetFile.iter_batches``, streamed; ``line`` is ``None``.
* ``hf`` (a directory): ``Dataset.save_to_disk`` output, the ``data-*.arrow`` files listed in
  ``state.json`` read batch by batch (``pyarrow.ipc.open_stream``); a ``DatasetDict`` directory
  (``dataset_dict.json``) is read at its ``split``; ``line`` is ``None``.

JSON documents: a top-level list of records, or an object holding one at the dotted
``records_key`` (``"data"``, ``"questions"``, ``"payload.items"``; a digit part indexes a list).
Without ``records_key``: the document when it is a list, else its only list-valued top-level key
(several → :class:`DatasetFormatError` naming them). The whole document is checked before the
first record is yielded, so a syntax error anywhere stops the read before any work is done.

``index`` is the 0-based record index and counts malformed records too (so fixing a bad record
renumbers nothing). Malformed records (invalid JSON line, not an object, wrong CSV field count)
go to the :class:`~hallulog.tasks.base.MalformedCollector`; for formats without lines
(parquet, hf) the collector gets the 1-based record number (``index + 1``) and a message starting
``"record N: "`` (:func:`report`). A file that cannot be read at all raises
:class:`~hallulog.tasks.base.DatasetFormatError`.
"""

from __future__ import annotations

import csv
import json
import logging
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from hallulog.tasks.base import DatasetFormatError, FileKindError, MalformedCollector, iter_jsonl
from hallulog.tasks.records_json import JsonDocument

__all__ = [
    "RecordAt",
    "FORMATS",
    "detect_format",
    "holds_json_lines",
    "iter_records",
    "iter_delimited",
    "iter_json",
    "iter_parquet",
    "iter_hf",
    "hf_split_dir",
    "JsonDocument",
    "get_field",
    "describe_where",
    "report",
    "record_number",
    "MISSING",
]

log = logging.getLogger(__name__)

FORMATS: tuple[str, ...] = ("auto", "jsonl", "json", "csv", "tsv", "parquet", "hf")
_EXTENSIONS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".csv": "csv",
    ".tsv": "tsv",
    ".parquet": "parquet",
}
_PARQUET_BATCH = 1024
# csv's default field limit (128 KiB) is too small for long passages in one cell.
_CSV_FIELD_LIMIT = 1 << 30


class RecordAt(NamedTuple):
    """One record of a file and where it is."""

    line: int | None
    """1-based line where the record starts; ``None`` for parquet and hf."""
    index: int
    """0-based record index (malformed records counted too)."""
    record: dict[str, Any]


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
"""The default of :func:`get_field` that makes a missing key raise ``KeyError``."""


# ----------------------------------------------------------------------------- small helpers


def record_number(line: int | None, index: int) -> int:
    """What the collector gets: the line, else the 1-based record number."""
    return line if line is not None else index + 1


def report(collector: MalformedCollector, line: int | None, index: int, message: str) -> None:
    """Hand one malformed record to ``collector``: by line, else as ``"record N: ..."``."""
    if line is None:
        collector.add(index + 1, f"record {index + 1}: {message}")
    else:
        collector.add(line, message)


def describe_where(path: str | Path, line: int | None, index: int) -> str:
    """``"file:line"``, or ``"file: record N"`` (N = index + 1) for formats without lines."""
    return f"{path}:{line}" if line is not None else f"{path}: record {index + 1}"


def get_field(record: Any, dotted_key: str, default: Any = MISSING) -> Any:
    """The value at ``dotted_key``: ``"a.b"`` reaches into nested objects, a digit part indexes
    a list (``"answers.text.0"``). A key holding a literal dot is found first. Missing: return
    ``default``, or raise ``KeyError(dotted_key)`` when none is given."""
    if isinstance(record, dict) and dotted_key in record:
        return record[dotted_key]
    value = record
    for part in dotted_key.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, (list, tuple)) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            if default is MISSING:
                raise KeyError(dotted_key)
            return default
    return value


def holds_json_lines(path: str | Path) -> bool:
    """Whether a ``.json`` file holds JSON Lines (HaluEval's ``qa_data.json``): its first
    non-blank line is a JSON object on its own and another non-blank line follows. A JSON
    document never is (one value: nothing may follow it), whether it spans lines or fits on
    one; only the first two non-blank lines are read."""
    first = None
    with open(path, "rb") as f:
        for raw in f:
            if not raw.strip():
                continue
            if first is not None:
                return True
            first = raw.removeprefix(b"\xef\xbb\xbf")
            try:
                if not isinstance(json.loads(first), dict):
                    return False
            except ValueError:  # a line of a document that spans lines (or not UTF-8)
                return False
    return False


def detect_format(path: str | Path, fmt: str = "auto") -> str:
    """The format of ``path``: ``fmt`` when given, else by extension (a directory: ``hf``)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such dataset file or directory")
    if fmt == "auto":
        if p.is_dir():
            return "hf"
        fmt = _EXTENSIONS.get(p.suffix.lower(), "")
        if not fmt:
            raise FileKindError(
                p,
                1,
                f"cannot tell the format from the extension {p.suffix!r} "
                f"(known: {', '.join(_EXTENSIONS)}); give the format explicitly",
            )
        if fmt == "json" and holds_json_lines(p):
            log.info("%s: one JSON object per line: read as JSON Lines", p)
            return "jsonl"
        return fmt
    if (fmt == "hf") != p.is_dir():
        raise ValueError(
            f"{p}: format {fmt!r} needs a "
            f"{'directory written by save_to_disk' if fmt == 'hf' else 'file'}"
        )
    return fmt


def iter_records(
    path: str | Path,
    *,
    fmt: str = "auto",
    records_key: str | None = None,
    split: str | None = None,
    collector: MalformedCollector,
) -> Iterator[RecordAt]:
    """The records of ``path`` in file order (see the module docstring). ``records_key`` applies
    to JSON documents, ``split`` to DatasetDict directories; both are ignored elsewhere."""
    kind = detect_format(path, fmt)
    if kind == "jsonl":
        return (RecordAt(line, index, obj) for line, index, obj in iter_jsonl(path, collector))
    if kind == "json":
        return iter_json(path, records_key, collector)
    if kind in ("csv", "tsv"):
        return iter_delimited(path, collector, delimiter="," if kind == "csv" else "\t")
    if kind == "parquet":
        return iter_parquet(path)
    return iter_hf(path, split)


# ----------------------------------------------------------------------------- CSV / TSV


def iter_delimited(
    path: str | Path,
    collector: MalformedCollector,
    *,
    delimiter: str = ",",
    fieldnames: Sequence[str] | None = None,
) -> Iterator[RecordAt]:
    """Rows of a CSV/TSV file as dicts, streamed: the header row names the fields, or
    ``fieldnames`` does (then every row is data, e.g. MMLU's headerless CSVs). Blank rows are no
    records; a row with the wrong number of fields is malformed; broken quoting is fatal."""
    if csv.field_size_limit() < _CSV_FIELD_LIMIT:
        csv.field_size_limit(min(_CSV_FIELD_LIMIT, sys.maxsize))
    path_s = str(path)
    with open(path_s, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter=delimiter, strict=True)
        try:
            yield from _rows(reader, path_s, collector, fieldnames)
        except UnicodeDecodeError as exc:
            raise FileKindError(
                path_s, reader.line_num + 1, f"not valid UTF-8 ({exc.reason})"
            ) from None


def _rows(
    reader: Any, path: str, collector: MalformedCollector, fieldnames: Sequence[str] | None
) -> Iterator[RecordAt]:
    if fieldnames is None:
        try:
            header = next(reader, None)
        except csv.Error as exc:
            raise DatasetFormatError(
                path, reader.line_num or 1, f"unreadable header: {exc}"
            ) from None
        if not header or not any(h.strip() for h in header):
            raise FileKindError(path, 1, "empty file or missing header row")
        names = [h.strip() for h in header]
    else:
        names = list(fieldnames)
    index = -1
    prev_line = reader.line_num
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise DatasetFormatError(path, prev_line + 1, f"unreadable row: {exc}") from None
        start, prev_line = prev_line + 1, reader.line_num
        if not row or all(not cell.strip() for cell in row):
            continue
        index += 1
        if len(row) != len(names):
            collector.add(
                start, f"expected {len(names)} fields ({', '.join(names)}), got {len(row)}"
            )
            continue
        yield RecordAt(start, index, dict(zip(names, row)))


# ----------------------------------------------------------------------------- Parquet / HF


def iter_parquet(path: str | Path, batch_size: int = _PARQUET_BATCH) -> Iterator[RecordAt]:
    """Rows of a Parquet file, ``batch_size`` at a time (``ParquetFile.iter_batches``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        # pre_buffer off: the default keeps every row group's compressed chunks once read
        # (memory grew with the file: docs/performance.md, "Reading task files")
        pf = pq.ParquetFile(str(path), pre_buffer=False)
    except (pa.ArrowException, OSError) as exc:
        raise FileKindError(path, 1, f"not a readable Parquet file: {exc}") from None
    index = 0
    with pf:
        batches = pf.iter_batches(batch_size=batch_size, use_threads=False)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except (pa.ArrowException, OSError) as exc:
                raise DatasetFormatError(
                    path, index + 1, f"record {index + 1}: unreadable Parquet: {exc}"
                ) from None
            for rec in batch.to_pylist():
                yield RecordAt(None, index, rec)
                index += 1


def hf_split_dir(path: str | Path, split: str | None) -> Path:
    """The dataset directory to read: ``path`` itself, or its ``split`` subdirectory when it is
    a DatasetDict (a DatasetDict with one split needs no ``split``)."""
    p = Path(path)
    dict_file = p / "dataset_dict.json"
    if dict_file.is_file():
        try:
            splits = json.loads(dict_file.read_text(encoding="utf-8"))["splits"]
        except (ValueError, KeyError, TypeError) as exc:
            raise DatasetFormatError(dict_file, 1, f"unreadable dataset_dict.json: {exc}") from None
        if split is None and len(splits) == 1:
            split = splits[0]
        if split not in splits:
            what = "choose a split" if split is None else f"no split {split!r}"
            raise FileKindError(
                p, 1, f"a DatasetDict directory: {what} (available: {', '.join(map(str, splits))})"
            )
        p = p / split
    if not (p / "state.json").is_file():
        raise FileKindError(
            p,
            1,
            "not a Hugging Face datasets directory (no state.json "
            "or dataset_dict.json; expected Dataset.save_to_disk output)",
        )
    return p


def iter_hf(path: str | Path, split: str | None = None) -> Iterator[RecordAt]:
    """Rows of a ``Dataset.save_to_disk`` directory (or one split of a DatasetDict), batch by
    batch from its Arrow IPC stream files, in ``state.json`` order."""
    import pyarrow as pa

    base = hf_split_dir(path, split)
    state_file = base / "state.json"
    try:
        files = [
            base / entry["filename"]
            for entry in json.loads(state_file.read_text(encoding="utf-8"))["_data_files"]
        ]
    except (ValueError, KeyError, TypeError) as exc:
        raise DatasetFormatError(state_file, 1, f"unreadable state.json: {exc}") from None
    index = 0
    for file in files:
        try:
            with pa.OSFile(str(file)) as source:
                for batch in pa.ipc.open_stream(source):
                    for rec in batch.to_pylist():
                        yield RecordAt(None, index, rec)
                        index += 1
        except (pa.ArrowException, OSError) as exc:
            raise DatasetFormatError(
                file, index + 1, f"record {index + 1}: unreadable Arrow data: {exc}"
            ) from None


# ----------------------------------------------------------------------------- JSON documents


def iter_json(
    path: str | Path, records_key: str | None, collector: MalformedCollector
) -> Iterator[RecordAt]:
    """The objects of a JSON document's list of records (the document is held as text, each
    item decoded when it is reached); an item that is not an object is malformed."""
    doc = JsonDocument(path)
    start = doc.locate(records_key)
    for index, (pos, value) in enumerate(doc.items(start)):
        line = doc.line_at(pos)
        if not isinstance(value, dict):
            collector.add(line, f"expected a JSON object, got {type(value).__name__}")
            continue
        yield RecordAt(line, index, value)

"""Consolidated Parquet tables, written in row groups while consolidation streams.

Next to ``consolidated/*.jsonl``: ``prompts.parquet``, ``generations.parquet``,
``activation_index.parquet`` and ``labels.parquet`` (schemas in docs/formats/parquet.md, which a
test compares with :data:`SCHEMAS`). Fields of a row that no column holds go, as one JSON
object, into the table's ``extra_json`` column, so nothing is lost when workers add fields.
Each file is written to ``*.parquet.partial`` and renamed into place when complete. The row
groups of the two big tables are built from the rows' JSONL lines by Arrow's JSON reader
(postrun/parquet_arrow.py), with the Python builders of
postrun/parquet_rows.py as the reference.

```python
import pandas as pd
gens = pd.read_parquet("run/consolidated/generations.parquet")
```
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from hallulog.contracts import layout
from hallulog.contracts.jsonl import parse_line
from hallulog.postrun.parquet_arrow import activation_table, generation_table
from hallulog.postrun.parquet_rows import (
    ACTIVATION_KNOWN,
    ROW_COLUMNS,
    GenerationColumns,
    activation_columns,
    extra_json,
    generation_extra,
    tuples_table,
)

__all__ = ["SCHEMAS", "PARQUET_FILES", "ParquetTables"]

_S, _I8, _I32, _I64 = pa.string(), pa.int8(), pa.int32(), pa.int64()
_F32, _B = pa.float32(), pa.bool_()

SCHEMAS: dict[str, pa.Schema] = {
    layout.PARQUET_TABLES[0]: pa.schema(
        [
            ("prompt_id", _S),
            ("dataset", _S),
            ("split", _S),
            ("dataset_id", _S),
            ("prompt", _S),
            ("messages", pa.list_(pa.struct([("role", _S), ("content", _S)]))),
            ("question", _S),
            ("reference_answer", _S),
            ("reference_aliases", pa.list_(_S)),
            ("label", _I8),
            ("label_grader", _S),
            ("label_status", _S),
            ("judge_verdict", _S),
            ("prompt_token_ids", pa.list_(_I32)),
            ("num_generations", _I32),
            ("worker_id", _I32),
            ("completed_at", _S),
            ("commit_id", _S),
            ("meta_json", _S),
            ("extra_json", _S),
        ]
    ),
    layout.PARQUET_TABLES[1]: pa.schema(
        [
            ("prompt_id", _S),
            ("sample_id", _I32),
            ("role", _S),
            ("text", _S),
            ("finish_reason", _S),
            ("prompt_tokens", _I32),
            ("completion_tokens", _I32),
            ("token_ids", pa.list_(_I32)),
            ("tokens", pa.list_(_S)),
            ("token_logprobs", pa.list_(_F32)),
            ("token_logits", pa.list_(_F32)),
            ("top_logprob_tokens", pa.list_(pa.list_(_S))),
            ("top_logprobs", pa.list_(pa.list_(_F32))),
            ("temperature", _F32),
            ("top_p", _F32),
            ("seed", _I64),
            ("max_tokens", _I32),
            ("generation_time_ms", _I64),
            ("label", _I8),
            ("label_grader", _S),
            ("label_status", _S),
            ("answer_span", pa.list_(_I32)),
            ("activation_key", _S),
            ("worker_id", _I32),
            ("commit_id", _S),
            ("extra_json", _S),
        ]
    ),
    layout.PARQUET_TABLES[2]: pa.schema(
        [
            ("prompt_id", _S),
            ("sample_id", _I32),
            ("activation_key", _S),
            ("layers", pa.list_(_I32)),
            ("sequence_mode", _S),
            ("capture_mode", _S),
            ("prompt_token_count", _I32),
            ("response_token_count", _I32),
            ("row0_position", _I32),
            ("num_rows", _I32),
            ("prompt_rows", _I32),
            ("response_rows", _I32),
            ("file_path", _S),
            ("byte_offset", _I64),
            ("shape", pa.list_(_I64)),
            ("dtype", _S),
            ("size_bytes", _I64),
            ("label", _I8),
            ("source_path", _S),
            ("worker_id", _I32),
            ("commit_id", _S),
            ("extra_json", _S),
        ]
    ),
    layout.PARQUET_TABLES[3]: pa.schema(
        [
            ("prompt_id", _S),
            ("label", _I8),
            ("label_grader", _S),
            ("label_source", _S),
            ("verdict", _S),
            ("abstained", _B),
            ("judge_model", _S),
            ("judge_verdict", _S),
        ]
    ),
}
PARQUET_FILES = layout.PARQUET_TABLES
assert tuple(SCHEMAS) == PARQUET_FILES

ROW_GROUP_ROWS = 8192
"""Rows buffered per row group; generations use a quarter of it (they are the big rows)."""


class _Table:
    """One Parquet file written in row groups of ``rows`` rows, from tuples of columns."""

    def __init__(self, path: Path, schema: pa.Schema, columns: Callable, rows: int) -> None:
        self.path, self.schema, self.columns, self.rows = path, schema, columns, rows
        self.tmp = path.with_name(path.name + ".partial")
        self.writer = pq.ParquetWriter(self.tmp, schema, compression="zstd")
        self.buffer: list = []
        self.written = 0

    def add(self, row: dict[str, Any]) -> None:
        self.buffer.append(self.columns(row))
        if len(self.buffer) >= self.rows:
            self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        self.writer.write_table(self._build())
        self.written += len(self.buffer)
        self.buffer = []

    def _build(self) -> pa.Table:
        return tuples_table(self.buffer, self.schema, self.path.name)

    def close(self, commit: bool) -> None:
        if commit:
            self.flush()
        self.writer.close()
        if commit:
            with open(self.tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(self.tmp, self.path)
        else:
            self.tmp.unlink(missing_ok=True)


class _LineTable(_Table):
    """A table whose row groups Arrow builds from the rows' JSONL lines (parquet_arrow.py),
    gathered in one buffer; the Python builder makes the row groups Arrow hands over, from the
    lines parsed again. ``add(row, line, row_kept)``: the row and its line (compact or spaced
    JSON of the same values); ``row_kept``: the row itself where parsing the line would not give
    it back (a line dumped from a row with a NaN in it, written as null)."""

    def __init__(
        self,
        path: Path,
        schema: pa.Schema,
        rows: int,
        *,
        arrow: Callable[[bytearray, list, pa.Schema], pa.Table | None],
        extra: Callable[[dict[str, Any]], str | None],
        fallback: Callable[[list, list, pa.Schema, str], pa.Table],
    ) -> None:
        super().__init__(path, schema, lambda row: row, rows)
        self.arrow, self.extra, self.fallback = arrow, extra, fallback
        self.data = bytearray()
        self.extras: list[str | None] = []

    def add(
        self,
        row: dict[str, Any],
        line: bytes,  # type: ignore[override]
        row_kept: dict[str, Any] | None = None,
    ) -> None:
        self.data += line
        self.extras.append(self.extra(row))
        self.buffer.append(row_kept)
        if len(self.buffer) >= self.rows:
            self.flush()

    def _build(self) -> pa.Table:
        data, self.data = self.data, bytearray()
        table = self.arrow(data, self.extras, self.schema)
        if table is None:
            lines = bytes(data).split(b"\n")[:-1]  # JSON text has no raw newline
            rows = [
                parse_line(line) if kept is None else kept for line, kept in zip(lines, self.buffer)
            ]
            table = self.fallback(rows, self.extras, self.schema, self.path.name)
        self.extras = []
        return table


def _generations_fallback(
    rows: list[dict[str, Any]], extras: list, schema: pa.Schema, where: str
) -> pa.Table:
    builder = GenerationColumns(Path(where), schema)
    for row in rows:
        builder.add(row)
    return builder.build()


def _activations_fallback(
    rows: list[dict[str, Any]], extras: list, schema: pa.Schema, where: str
) -> pa.Table:
    return tuples_table(
        [activation_columns(row)[:-1] + (extra,) for row, extra in zip(rows, extras)], schema, where
    )


def _generation_table(path: Path, schema: pa.Schema, rows: int) -> _LineTable:
    return _LineTable(
        path,
        schema,
        rows,
        arrow=generation_table,
        extra=generation_extra,
        fallback=_generations_fallback,
    )


def _activation_table(path: Path, schema: pa.Schema, rows: int) -> _LineTable:
    return _LineTable(
        path,
        schema,
        rows,
        arrow=activation_table,
        extra=lambda row: extra_json(row, ACTIVATION_KNOWN),
        fallback=_activations_fallback,
    )


class ParquetTables:
    """The four consolidated tables of one consolidation; ``close(commit=True)`` publishes them."""

    def __init__(self, out_dir: Path, *, row_group_rows: int = ROW_GROUP_ROWS) -> None:
        out_dir = Path(out_dir)
        self.tables: dict[str, Any] = {
            name: (
                _generation_table(out_dir / name, schema, max(1, row_group_rows // 4))
                if name == layout.GENERATIONS_PARQUET
                else _activation_table(out_dir / name, schema, row_group_rows)
                if name == layout.ACTIVATION_INDEX_PARQUET
                else _Table(out_dir / name, schema, ROW_COLUMNS[name], row_group_rows)
            )
            for name, schema in SCHEMAS.items()
        }
        self.add_generation = self.tables[layout.GENERATIONS_PARQUET].add
        self.add_activation = self.tables[layout.ACTIVATION_INDEX_PARQUET].add
        self._add_prompt = self.tables[layout.PROMPTS_PARQUET].add
        self._add_label = self.tables[layout.LABELS_PARQUET].add

    def add_prompt(self, row: dict[str, Any]) -> None:
        """A consolidated prompt row (labels applied): one row in prompts and in labels."""
        self._add_prompt(row)
        self._add_label(row)

    def close(self, *, commit: bool = True) -> dict[str, int]:
        for table in self.tables.values():
            table.close(commit)
        return {name: t.written for name, t in self.tables.items()}

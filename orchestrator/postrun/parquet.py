"""Consolidated Parquet tables, written in row groups while consolidation streams.

Next to ``consolidated/*.jsonl``: ``prompts.parquet``, ``generations.parquet``,
``activation_index.parquet`` and ``labels.parquet`` (schemas in docs/formats/parquet.md, which a
test compares with :data:`SCHEMAS`). Fields of a row that no column holds go, as one JSON
object, into the table's ``extra_json`` column, so nothing is lost when workers add fields.
Each file is written to ``*.parquet.partial`` and renamed into place when complete. The row
groups of the two big tables are built from the rows' JSONL lines by Arrow's JSON reader
(orchestrator/postrun/parquet_arrow.py), with the Python builders here as the reference.

```python
import pandas as pd
gens = pd.read_parquet("run/consolidated/generations.parquet")
```
"""

from __future__ import annotations

import json
import logging
import os
from itertools import repeat
from operator import itemgetter
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from contracts import layout
from contracts.jsonl import dumps, parse_line
from orchestrator.postrun.parquet_arrow import activation_table, generation_table

log = logging.getLogger(__name__)

__all__ = ["SCHEMAS", "PARQUET_FILES", "ParquetTables"]

_S, _I8, _I32, _I64 = pa.string(), pa.int8(), pa.int32(), pa.int64()
_F32, _F64, _B = pa.float32(), pa.float64(), pa.bool_()

SCHEMAS: dict[str, pa.Schema] = {
    layout.PARQUET_TABLES[0]: pa.schema([
        ("prompt_id", _S), ("dataset", _S), ("split", _S), ("dataset_id", _S), ("prompt", _S),
        ("messages", pa.list_(pa.struct([("role", _S), ("content", _S)]))),
        ("question", _S), ("reference_answer", _S), ("reference_aliases", pa.list_(_S)),
        ("label", _I8), ("label_grader", _S), ("judge_verdict", _S),
        ("prompt_token_ids", pa.list_(_I32)), ("num_generations", _I32), ("worker_id", _I32),
        ("completed_at", _S), ("commit_id", _S), ("meta_json", _S), ("extra_json", _S),
    ]),
    layout.PARQUET_TABLES[1]: pa.schema([
        ("prompt_id", _S), ("sample_id", _I32), ("role", _S), ("text", _S),
        ("finish_reason", _S), ("prompt_tokens", _I32), ("completion_tokens", _I32),
        ("token_ids", pa.list_(_I32)), ("tokens", pa.list_(_S)),
        ("token_logprobs", pa.list_(_F32)), ("token_logits", pa.list_(_F32)),
        ("top_logprob_tokens", pa.list_(pa.list_(_S))),
        ("top_logprobs", pa.list_(pa.list_(_F32))),
        ("temperature", _F32), ("top_p", _F32), ("seed", _I64), ("max_tokens", _I32),
        ("generation_time_ms", _I64), ("label", _I8), ("label_grader", _S),
        ("activation_key", _S), ("worker_id", _I32), ("commit_id", _S), ("extra_json", _S),
    ]),
    layout.PARQUET_TABLES[2]: pa.schema([
        ("prompt_id", _S), ("sample_id", _I32), ("activation_key", _S),
        ("layers", pa.list_(_I32)), ("sequence_mode", _S), ("capture_mode", _S),
        ("prompt_token_count", _I32), ("response_token_count", _I32),
        ("row0_position", _I32), ("num_rows", _I32), ("prompt_rows", _I32),
        ("response_rows", _I32), ("file_path", _S), ("byte_offset", _I64),
        ("shape", pa.list_(_I64)), ("dtype", _S), ("size_bytes", _I64), ("label", _I8),
        ("source_path", _S), ("worker_id", _I32), ("commit_id", _S), ("extra_json", _S),
    ]),
    layout.PARQUET_TABLES[3]: pa.schema([
        ("prompt_id", _S), ("label", _I8), ("label_grader", _S), ("label_source", _S),
        ("verdict", _S), ("abstained", _B), ("judge_model", _S), ("judge_verdict", _S),
    ]),
}
PARQUET_FILES = layout.PARQUET_TABLES
assert tuple(SCHEMAS) == PARQUET_FILES

ROW_GROUP_ROWS = 8192
"""Rows buffered per row group; generations use a quarter of it (they are the big rows)."""


def _array(values: list, type_: pa.DataType, where: str) -> pa.Array:
    """``pa.array(values, type_)``; a value of another type becomes null (with a warning)
    instead of failing the consolidation: the JSONL files stay the reference."""
    try:
        return pa.array(values, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        pass
    kept, dropped = [], 0
    for value in values:
        try:
            pa.array([value], type=type_)
            kept.append(value)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
            kept.append(None)
            dropped += 1
    log.warning("%s: %d value(s) not of type %s stored as null", where, dropped, type_)
    return pa.array(kept, type=type_)


def _json_or_none(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def _str(value: Any) -> str | None:
    return value if value is None or isinstance(value, str) else json.dumps(value)


def _extra(row: dict[str, Any], known: frozenset[str]) -> str | None:
    if row.keys() <= known:
        return None
    rest = {k: v for k, v in row.items() if k not in known}
    return json.dumps(rest, ensure_ascii=False) if rest else None


def _prompt_columns(row: dict[str, Any]) -> tuple:
    meta = row.get("meta")
    ref = row.get("reference")
    aliases = ref.get("aliases") if isinstance(ref, dict) else None
    messages = [{"role": _str(m.get("role")), "content": _str(m.get("content"))}
                for m in row.get("messages") or [] if isinstance(m, dict)]
    return (row.get("prompt_id"), _str(row.get("dataset")), _str(row.get("split")),
            _str(row.get("dataset_id")), _str(row.get("prompt")), messages,
            _str(meta.get("question")) if isinstance(meta, dict) else None,
            _str(row.get("reference_answer")), aliases, row.get("label"),
            _str(row.get("label_grader")), _str(row.get("judge_verdict")),
            row.get("prompt_token_ids"), row.get("num_generations"), row.get("worker_id"),
            _str(row.get("completed_at")), _str(row.get("commit_id")), _json_or_none(meta),
            _extra(row, _PROMPT_KNOWN))


_PROMPT_KNOWN = frozenset({
    "prompt_id", "dataset", "split", "dataset_id", "prompt", "messages", "meta",
    "reference_answer", "label", "label_grader", "judge_verdict", "prompt_token_ids",
    "num_generations", "worker_id", "completed_at", "commit_id"})


_GENERATION_KNOWN = frozenset({
    "prompt_id", "sample_id", "role", "text", "finish_reason", "usage", "logprobs",
    "token_ids", "request_params", "generation_time_ms", "label", "label_grader",
    "activation_key", "worker_id", "commit_id"})
_PARAMS_KNOWN = frozenset({"temperature", "top_p", "seed", "max_tokens"})


def _generation_extra(row: dict[str, Any]) -> str | None:
    rest = {k: v for k, v in row.items() if k not in _GENERATION_KNOWN}
    params = row.get("request_params")
    if isinstance(params, dict):
        more = {k: v for k, v in params.items() if k not in _PARAMS_KNOWN}
        if more:
            rest["request_params"] = more
    return dumps(rest).rstrip("\n") if rest else None  # orjson: one of these per generation


_ACTIVATION_FIELDS = ("prompt_id", "sample_id", "activation_key", "layers", "sequence_mode",
                      "capture_mode", "prompt_token_count", "response_token_count",
                      "row0_position", "num_rows", "prompt_rows", "response_rows", "file_path",
                      "byte_offset", "shape", "dtype", "size_bytes", "label", "source_path",
                      "worker_id", "commit_id")
_ACTIVATION_KNOWN = frozenset(_ACTIVATION_FIELDS)


def _activation_columns(row: dict[str, Any]) -> tuple:
    layers = row.get("layers")
    return tuple((layers if isinstance(layers, list) else None) if name == "layers"
                 else row.get(name) for name in _ACTIVATION_FIELDS) \
        + (_extra(row, _ACTIVATION_KNOWN),)


def _label_columns(row: dict[str, Any]) -> tuple:
    source = "judge" if "verdict" in row else "worker"
    return (row.get("prompt_id"), row.get("label"), _str(row.get("label_grader")), source,
            _str(row.get("verdict")), row.get("abstained"), _str(row.get("judge_model")),
            _str(row.get("judge_verdict")))


_COLUMNS: dict[str, Callable[[dict[str, Any]], tuple]] = {
    "prompts.parquet": _prompt_columns,
    "labels.parquet": _label_columns,
}


_TOKEN, _LOGPROB, _TOP = itemgetter("token"), itemgetter("logprob"), itemgetter("top_logprobs")


class _GenerationColumns:
    """generations.parquet rows in Python, column by column: list columns as flat values +
    offsets (no per-token Python lists, no per-row tuples). The reference builder: the
    Arrow one (parquet_arrow.py) hands a row group over to it when unsure."""

    SCALARS = ("prompt_id", "sample_id", "role", "text", "finish_reason", "prompt_tokens",
               "completion_tokens", "temperature", "top_p", "seed", "max_tokens",
               "generation_time_ms", "label", "label_grader", "activation_key", "worker_id",
               "commit_id", "extra_json")

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.path, self.schema = path, schema
        self._reset()

    def _reset(self) -> None:
        self.n = 0
        self.scalars: dict[str, list] = {name: [] for name in self.SCALARS}
        self.token_ids: list = []
        self.token_ids_off: list[int] = [0]
        self.token_ids_valid: list[bool] = []
        self.tokens: list = []
        self.lps: list = []
        self.logits: list = []
        self.tok_off: list[int] = [0]  # tokens, token_logprobs, top_* outer offsets
        self.logits_valid: list[bool] = []
        self.top_tok: list = []
        self.top_lp: list = []
        self.top_off: list[int] = [0]

    def add(self, row: dict[str, Any]) -> None:
        sc = self.scalars
        get = row.get
        usage = get("usage")
        usage = usage if isinstance(usage, dict) else {}
        params = get("request_params")
        params = params if isinstance(params, dict) else {}
        for name, value in (
                ("prompt_id", get("prompt_id")), ("sample_id", get("sample_id")),
                ("role", _str(get("role"))), ("text", _str(get("text"))),
                ("finish_reason", _str(get("finish_reason"))),
                ("prompt_tokens", usage.get("prompt_tokens")),
                ("completion_tokens", usage.get("completion_tokens")),
                ("temperature", params.get("temperature")), ("top_p", params.get("top_p")),
                ("seed", params.get("seed")), ("max_tokens", params.get("max_tokens")),
                ("generation_time_ms", get("generation_time_ms")), ("label", get("label")),
                ("label_grader", _str(get("label_grader"))),
                ("activation_key", _str(get("activation_key"))),
                ("worker_id", get("worker_id")), ("commit_id", _str(get("commit_id"))),
                ("extra_json", _generation_extra(row))):
            sc[name].append(value)
        ids = get("token_ids")
        if isinstance(ids, list):
            self.token_ids.extend(ids)
            self.token_ids_valid.append(True)
        else:
            self.token_ids_valid.append(False)
        self.token_ids_off.append(len(self.token_ids))
        lps = get("logprobs") or []
        try:
            self._add_logprobs_fast(lps)
        except (KeyError, TypeError, AttributeError):
            self._add_logprobs(lps)
        self.tok_off.append(len(self.tokens))
        self.n += 1

    def _add_logprobs_fast(self, lps: list[dict[str, Any]]) -> None:
        """Worker rows: every entry has token, logprob, logit and top_logprobs (C-level maps)."""
        n_top, n_off = len(self.top_tok), len(self.top_off)
        try:
            tokens = list(map(_TOKEN, lps))
            lp = list(map(_LOGPROB, lps))
            logits = list(map(dict.get, lps, repeat("logit")))  # vLLM gives no logit
            tops = list(map(_TOP, lps))
            top_off, top_tok, top_lp = self.top_off, self.top_tok, self.top_lp
            for top in tops:
                top_tok.extend(map(_TOKEN, top))
                top_lp.extend(map(_LOGPROB, top))
                top_off.append(len(top_tok))
        except BaseException:
            del self.top_tok[n_top:], self.top_lp[n_top:], self.top_off[n_off:]
            raise
        self.tokens.extend(tokens)
        self.lps.extend(lp)
        self.logits.extend(logits)
        self.logits_valid.append(any(v is not None for v in logits))

    def _add_logprobs(self, lps: list[dict[str, Any]]) -> None:
        has_logit = False
        for t in lps:
            self.tokens.append(t.get("token"))
            self.lps.append(t.get("logprob"))
            logit = t.get("logit")
            self.logits.append(logit)
            has_logit = has_logit or logit is not None
            for a in t.get("top_logprobs") or ():
                self.top_tok.append(a.get("token"))
                self.top_lp.append(a.get("logprob"))
            self.top_off.append(len(self.top_tok))
        self.logits_valid.append(has_logit)

    def build(self) -> pa.Table:
        """The rows added so far as one table; the builder starts over."""
        types = {f.name: f.type for f in self.schema}
        i32 = pa.int32()
        tok_off = pa.array(self.tok_off, type=i32)
        where = self.path.name

        def arr(values: list, type_: pa.DataType, column: str) -> pa.Array:
            return _array(values, type_, f"{where} {column}")

        cols = {name: arr(values, types[name], name) for name, values in self.scalars.items()}
        cols["token_ids"] = pa.ListArray.from_arrays(
            pa.array(self.token_ids_off, type=i32), arr(self.token_ids, _I32, "token_ids"),
            mask=pa.array([not v for v in self.token_ids_valid], type=_B))
        cols["tokens"] = pa.ListArray.from_arrays(tok_off, arr(self.tokens, _S, "tokens"))
        cols["token_logprobs"] = pa.ListArray.from_arrays(
            tok_off, arr(self.lps, _F32, "token_logprobs"))
        cols["token_logits"] = pa.ListArray.from_arrays(
            tok_off, arr(self.logits, _F32, "token_logits"),
            mask=pa.array([not v for v in self.logits_valid], type=_B))
        top_off = pa.array(self.top_off, type=i32)
        cols["top_logprob_tokens"] = pa.ListArray.from_arrays(
            tok_off, pa.ListArray.from_arrays(top_off, arr(self.top_tok, _S, "top_logprobs")))
        cols["top_logprobs"] = pa.ListArray.from_arrays(
            tok_off, pa.ListArray.from_arrays(top_off, arr(self.top_lp, _F32, "top_logprobs")))
        self._reset()
        return pa.Table.from_arrays([cols[f.name] for f in self.schema], schema=self.schema)


def _tuples_table(buffer: list[tuple], schema: pa.Schema, where: str) -> pa.Table:
    """Rows given as tuples of column values (schema order) as one table."""
    cols = list(zip(*buffer))
    arrays = [_array(list(col), field.type, f"{where} {field.name}")
              for col, field in zip(cols, schema)]
    return pa.Table.from_arrays(arrays, schema=schema)


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
        return _tuples_table(self.buffer, self.schema, self.path.name)

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

    def __init__(self, path: Path, schema: pa.Schema, rows: int, *,
                 arrow: Callable[[bytearray, list, pa.Schema], pa.Table | None],
                 extra: Callable[[dict[str, Any]], str | None],
                 fallback: Callable[[list, list, pa.Schema, str], pa.Table]) -> None:
        super().__init__(path, schema, lambda row: row, rows)
        self.arrow, self.extra, self.fallback = arrow, extra, fallback
        self.data = bytearray()
        self.extras: list[str | None] = []

    def add(self, row: dict[str, Any], line: bytes,  # type: ignore[override]
            row_kept: dict[str, Any] | None = None) -> None:
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
            rows = [parse_line(line) if kept is None else kept
                    for line, kept in zip(lines, self.buffer)]
            table = self.fallback(rows, self.extras, self.schema, self.path.name)
        self.extras = []
        return table


def _generations_fallback(rows: list[dict[str, Any]], extras: list, schema: pa.Schema,
                          where: str) -> pa.Table:
    builder = _GenerationColumns(Path(where), schema)
    for row in rows:
        builder.add(row)
    return builder.build()


def _activations_fallback(rows: list[dict[str, Any]], extras: list, schema: pa.Schema,
                          where: str) -> pa.Table:
    return _tuples_table([_activation_columns(row)[:-1] + (extra,)
                          for row, extra in zip(rows, extras)], schema, where)


def _generation_table(path: Path, schema: pa.Schema, rows: int) -> _LineTable:
    return _LineTable(path, schema, rows, arrow=generation_table, extra=_generation_extra,
                      fallback=_generations_fallback)


def _activation_table(path: Path, schema: pa.Schema, rows: int) -> _LineTable:
    return _LineTable(path, schema, rows, arrow=activation_table,
                      extra=lambda row: _extra(row, _ACTIVATION_KNOWN),
                      fallback=_activations_fallback)


class ParquetTables:
    """The four consolidated tables of one consolidation; ``close(commit=True)`` publishes them."""

    def __init__(self, out_dir: Path, *, row_group_rows: int = ROW_GROUP_ROWS) -> None:
        out_dir = Path(out_dir)
        self.tables: dict[str, Any] = {
            name: (_generation_table(out_dir / name, schema, max(1, row_group_rows // 4))
                   if name == "generations.parquet"
                   else _activation_table(out_dir / name, schema, row_group_rows)
                   if name == "activation_index.parquet"
                   else _Table(out_dir / name, schema, _COLUMNS[name], row_group_rows))
            for name, schema in SCHEMAS.items()}
        self.add_generation = self.tables["generations.parquet"].add
        self.add_activation = self.tables["activation_index.parquet"].add
        self._add_prompt = self.tables["prompts.parquet"].add
        self._add_label = self.tables["labels.parquet"].add

    def add_prompt(self, row: dict[str, Any]) -> None:
        """A consolidated prompt row (labels applied): one row in prompts and in labels."""
        self._add_prompt(row)
        self._add_label(row)

    def close(self, *, commit: bool = True) -> dict[str, int]:
        for table in self.tables.values():
            table.close(commit)
        return {name: t.written for name, t in self.tables.items()}

"""Row groups of the big consolidated tables built by Arrow's JSON reader, not row by row.

The rows of ``generations.parquet`` and ``activation_index.parquet`` are JSONL lines that
consolidation has in hand anyway; parsing a whole row group of them with ``pyarrow.json`` (C++)
and shaping the columns with offsets arrays costs a fraction of walking every token's dicts in
Python. The Python builders in postrun/parquet_rows.py stay the reference: a batch is
built here only when the result is certain to be theirs, value for value, and ``None`` is
returned otherwise (the caller then parses the lines and uses them):

- the JSON reader is given the expected types and fails on any other (a string where a number
  goes, a float for an int, an int out of range, a duplicate key): where the Python builder
  would store a null with a warning, or fail, this one hands over;
- numbers meant for float columns are read as float64 and cast as ``pa.array`` casts a Python
  float; one beyond 2**24 in magnitude hands over (``pa.array`` refuses an int there);
- a null where the Python builder expects a dict (a logprobs entry, a top-logprob) hands over,
  and so does the int ``-0`` (0.0 to Python, -0.0 to the reader).

Fields no column holds are ignored by the reader; the caller passes each row's ``extra_json``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

__all__ = ["generation_table", "activation_table"]

_S, _I8, _I32, _I64 = pa.string(), pa.int8(), pa.int32(), pa.int64()
_F32, _F64, _B = pa.float32(), pa.float64(), pa.bool_()

_TOP = pa.struct([("token", _S), ("logprob", _F64)])
_GENERATION_JSON = pa.schema(
    [
        ("prompt_id", _S),
        ("sample_id", _I32),
        ("role", _S),
        ("text", _S),
        ("finish_reason", _S),
        ("usage", pa.struct([("prompt_tokens", _I32), ("completion_tokens", _I32)])),
        (
            "logprobs",
            pa.list_(
                pa.struct(
                    [
                        ("token", _S),
                        ("logprob", _F64),
                        ("logit", _F64),
                        ("top_logprobs", pa.list_(_TOP)),
                    ]
                )
            ),
        ),
        ("token_ids", pa.list_(_I32)),
        (
            "request_params",
            pa.struct(
                [("temperature", _F64), ("top_p", _F64), ("seed", _I64), ("max_tokens", _I32)]
            ),
        ),
        ("generation_time_ms", _I64),
        ("label", _I8),
        ("label_grader", _S),
        ("label_status", _S),
        ("answer_span", pa.list_(_I32)),
        ("activation_key", _S),
        ("worker_id", _I32),
        ("commit_id", _S),
    ]
)

_FLOAT_EXACT = float(2**24)  # pa.array refuses an int beyond this for float32
_INT_MINUS_ZERO = re.compile(rb"-0[,\]}]")  # JSON numbers have no leading zeros: the int -0


def _read(data: bytes | bytearray, schema: pa.Schema) -> pa.Table | None:
    """The lines in ``data`` as one table of ``schema``'s columns; None when the reader refuses
    (a value of another type, a duplicate key, ...)."""
    try:
        table = pj.read_json(
            pa.BufferReader(pa.py_buffer(data)),  # no copy of the lines
            read_options=pj.ReadOptions(use_threads=False, block_size=len(data) + 1),
            parse_options=pj.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="ignore"
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return table.combine_chunks()


def _offsets(lists: pa.Array) -> pa.Array:
    """int32 offsets of a list array, a null list counting as empty."""
    lengths = np.asarray(pc.fill_null(pc.list_value_length(lists), 0), dtype=np.int32)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.array(offsets, type=_I32)


def _float32(values: pa.Array, data: bytes | bytearray) -> pa.Array | None:
    """float64 → float32 as ``pa.array(python_floats, float32)`` does; None beyond 2**24, or
    for a -0.0 when ``data`` has the int ``-0`` (0.0 to Python, -0.0 to the JSON reader)."""
    if not len(values) or values.null_count == len(values):
        return pc.cast(values, _F32, safe=False)
    floats = np.asarray(values.fill_null(1.0) if values.null_count else values)
    if (np.abs(floats) > _FLOAT_EXACT).any():
        return None
    if np.signbit(floats[floats == 0]).any() and _INT_MINUS_ZERO.search(data):
        return None
    return pc.cast(values, _F32, safe=False)


def _field(structs: pa.Array, name: str) -> pa.Array:
    return pc.struct_field(structs, name)


def _logprob_columns(logprobs: pa.Array, data: bytes | bytearray) -> dict[str, pa.Array] | None:
    """tokens, token_logprobs, token_logits, top_logprob_tokens, top_logprobs."""
    tok_off = _offsets(logprobs)
    entries = logprobs.flatten()
    if entries.null_count:
        return None  # the Python builder fails on a null entry
    tops = _field(entries, "top_logprobs")
    top_off = _offsets(tops)
    top_entries = tops.flatten()
    if top_entries.null_count:
        return None
    lps = _float32(_field(entries, "logprob"), data)
    logits = _float32(_field(entries, "logit"), data)
    top_lps = _float32(_field(top_entries, "logprob"), data)
    if lps is None or logits is None or top_lps is None:
        return None
    # a row's logits list is null when none of its entries has one (empty rows included)
    seen = np.zeros(len(entries) + 1, dtype=np.int64)
    np.cumsum(np.asarray(logits.is_valid()), out=seen[1:])
    off = np.asarray(tok_off)
    no_logit = pa.array(seen[off[1:]] == seen[off[:-1]], type=_B)
    return {
        "tokens": pa.ListArray.from_arrays(tok_off, _field(entries, "token")),
        "token_logprobs": pa.ListArray.from_arrays(tok_off, lps),
        "token_logits": pa.ListArray.from_arrays(tok_off, logits, mask=no_logit),
        "top_logprob_tokens": pa.ListArray.from_arrays(
            tok_off, pa.ListArray.from_arrays(top_off, _field(top_entries, "token"))
        ),
        "top_logprobs": pa.ListArray.from_arrays(
            tok_off, pa.ListArray.from_arrays(top_off, top_lps)
        ),
    }


def generation_table(
    data: bytes | bytearray, extras: Sequence[str | None], schema: pa.Schema
) -> pa.Table | None:
    """The ``generations.parquet`` rows of the JSONL lines in ``data`` (``extras``: each row's
    ``extra_json``), or None when the Python builder is needed."""
    table = _read(data, _GENERATION_JSON)
    if table is None or table.num_rows != len(extras):
        return None
    col = {name: table.column(name).combine_chunks() for name in table.column_names}
    out = _logprob_columns(col["logprobs"], data)
    if out is None:
        return None
    usage, params = col["usage"], col["request_params"]
    temperature = _float32(_field(params, "temperature"), data)
    top_p = _float32(_field(params, "top_p"), data)
    if temperature is None or top_p is None:
        return None
    ids = col["token_ids"]
    out.update(
        prompt_tokens=_field(usage, "prompt_tokens"),
        completion_tokens=_field(usage, "completion_tokens"),
        temperature=temperature,
        top_p=top_p,
        seed=_field(params, "seed"),
        max_tokens=_field(params, "max_tokens"),
        token_ids=pa.ListArray.from_arrays(_offsets(ids), ids.flatten(), mask=pc.is_null(ids)),
        extra_json=pa.array(extras, type=_S),
    )
    for name in (
        "prompt_id",
        "sample_id",
        "role",
        "text",
        "finish_reason",
        "generation_time_ms",
        "label",
        "label_grader",
        "label_status",
        "answer_span",
        "activation_key",
        "worker_id",
        "commit_id",
    ):
        out[name] = col[name]
    return pa.Table.from_arrays([out[f.name] for f in schema], schema=schema)


def activation_table(
    data: bytes | bytearray, extras: Sequence[str | None], schema: pa.Schema
) -> pa.Table | None:
    """The ``activation_index.parquet`` rows of the JSONL lines in ``data``, or None."""
    fields = [f for f in schema if f.name != "extra_json"]
    table = _read(data, pa.schema(fields))
    if table is None or table.num_rows != len(extras):
        return None
    arrays = [table.column(f.name).combine_chunks() for f in fields]
    arrays.append(pa.array(extras, type=_S))
    return pa.Table.from_arrays(arrays, schema=schema)

"""The Python builders of the consolidated Parquet tables: one row's columns, the reference.

postrun/parquet.py writes the tables; the Arrow builder of the two big tables
(parquet_arrow.py) hands a row group back to these when it is not certain to match them.
A value of the wrong type for its column becomes null with a warning (:func:`array_or_nulls`):
the JSONL files stay the reference. Fields no column holds go into ``extra_json``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from itertools import repeat
from operator import itemgetter
from pathlib import Path
from typing import Any

import pyarrow as pa
from hallulog.contracts import layout
from hallulog.contracts.jsonl import dumps

log = logging.getLogger(__name__)

__all__ = [
    "array_or_nulls",
    "extra_json",
    "prompt_columns",
    "generation_extra",
    "activation_columns",
    "label_columns",
    "ROW_COLUMNS",
    "ACTIVATION_KNOWN",
    "GenerationColumns",
    "tuples_table",
]

_S, _I32, _F32, _B = pa.string(), pa.int32(), pa.float32(), pa.bool_()


def array_or_nulls(values: list, type_: pa.DataType, where: str) -> pa.Array:
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


def extra_json(row: dict[str, Any], known: frozenset[str]) -> str | None:
    if row.keys() <= known:
        return None
    rest = {k: v for k, v in row.items() if k not in known}
    return json.dumps(rest, ensure_ascii=False) if rest else None


def prompt_columns(row: dict[str, Any]) -> tuple:
    meta = row.get("meta")
    ref = row.get("reference")
    aliases = ref.get("aliases") if isinstance(ref, dict) else None
    messages = [
        {"role": _str(m.get("role")), "content": _str(m.get("content"))}
        for m in row.get("messages") or []
        if isinstance(m, dict)
    ]
    return (
        row.get("prompt_id"),
        _str(row.get("dataset")),
        _str(row.get("split")),
        _str(row.get("dataset_id")),
        _str(row.get("prompt")),
        messages,
        _str(meta.get("question")) if isinstance(meta, dict) else None,
        _str(row.get("reference_answer")),
        aliases,
        row.get("label"),
        _str(row.get("label_grader")),
        _str(row.get("label_status")),
        _str(row.get("judge_verdict")),
        row.get("prompt_token_ids"),
        row.get("num_generations"),
        row.get("worker_id"),
        _str(row.get("completed_at")),
        _str(row.get("commit_id")),
        _json_or_none(meta),
        extra_json(row, _PROMPT_KNOWN),
    )


_PROMPT_KNOWN = frozenset(
    {
        "prompt_id",
        "dataset",
        "split",
        "dataset_id",
        "prompt",
        "messages",
        "meta",
        "reference_answer",
        "label",
        "label_grader",
        "label_status",
        "judge_verdict",
        "prompt_token_ids",
        "num_generations",
        "worker_id",
        "completed_at",
        "commit_id",
    }
)


_GENERATION_KNOWN = frozenset(
    {
        "prompt_id",
        "sample_id",
        "role",
        "text",
        "finish_reason",
        "usage",
        "logprobs",
        "token_ids",
        "request_params",
        "generation_time_ms",
        "label",
        "label_grader",
        "label_status",
        "answer_span",
        "activation_key",
        "worker_id",
        "commit_id",
    }
)
_PARAMS_KNOWN = frozenset({"temperature", "top_p", "seed", "max_tokens"})


def generation_extra(row: dict[str, Any]) -> str | None:
    rest = {k: v for k, v in row.items() if k not in _GENERATION_KNOWN}
    params = row.get("request_params")
    if isinstance(params, dict):
        more = {k: v for k, v in params.items() if k not in _PARAMS_KNOWN}
        if more:
            rest["request_params"] = more
    return dumps(rest).rstrip("\n") if rest else None  # orjson: one of these per generation


_ACTIVATION_FIELDS = (
    "prompt_id",
    "sample_id",
    "activation_key",
    "layers",
    "sequence_mode",
    "capture_mode",
    "prompt_token_count",
    "response_token_count",
    "row0_position",
    "num_rows",
    "prompt_rows",
    "response_rows",
    "file_path",
    "byte_offset",
    "shape",
    "dtype",
    "size_bytes",
    "label",
    "source_path",
    "worker_id",
    "commit_id",
)
ACTIVATION_KNOWN = frozenset(_ACTIVATION_FIELDS)


def activation_columns(row: dict[str, Any]) -> tuple:
    layers = row.get("layers")
    return tuple(
        (layers if isinstance(layers, list) else None) if name == "layers" else row.get(name)
        for name in _ACTIVATION_FIELDS
    ) + (extra_json(row, ACTIVATION_KNOWN),)


def label_columns(row: dict[str, Any]) -> tuple:
    source = "judge" if "verdict" in row else "worker"
    return (
        row.get("prompt_id"),
        row.get("label"),
        _str(row.get("label_grader")),
        source,
        _str(row.get("verdict")),
        row.get("abstained"),
        _str(row.get("judge_model")),
        _str(row.get("judge_verdict")),
    )


ROW_COLUMNS: dict[str, Callable[[dict[str, Any]], tuple]] = {
    layout.PROMPTS_PARQUET: prompt_columns,
    layout.LABELS_PARQUET: label_columns,
}


_TOKEN, _LOGPROB, _TOP = itemgetter("token"), itemgetter("logprob"), itemgetter("top_logprobs")


class GenerationColumns:
    """generations.parquet rows in Python, column by column: list columns as flat values +
    offsets (no per-token Python lists, no per-row tuples). The reference builder: the
    Arrow one (parquet_arrow.py) hands a row group over to it when unsure."""

    SCALARS = (
        "prompt_id",
        "sample_id",
        "role",
        "text",
        "finish_reason",
        "prompt_tokens",
        "completion_tokens",
        "temperature",
        "top_p",
        "seed",
        "max_tokens",
        "generation_time_ms",
        "label",
        "label_grader",
        "label_status",
        "answer_span",
        "activation_key",
        "worker_id",
        "commit_id",
        "extra_json",
    )

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
            ("prompt_id", get("prompt_id")),
            ("sample_id", get("sample_id")),
            ("role", _str(get("role"))),
            ("text", _str(get("text"))),
            ("finish_reason", _str(get("finish_reason"))),
            ("prompt_tokens", usage.get("prompt_tokens")),
            ("completion_tokens", usage.get("completion_tokens")),
            ("temperature", params.get("temperature")),
            ("top_p", params.get("top_p")),
            ("seed", params.get("seed")),
            ("max_tokens", params.get("max_tokens")),
            ("generation_time_ms", get("generation_time_ms")),
            ("label", get("label")),
            ("label_grader", _str(get("label_grader"))),
            ("label_status", _str(get("label_status"))),
            ("answer_span", get("answer_span")),
            ("activation_key", _str(get("activation_key"))),
            ("worker_id", get("worker_id")),
            ("commit_id", _str(get("commit_id"))),
            ("extra_json", generation_extra(row)),
        ):
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
            return array_or_nulls(values, type_, f"{where} {column}")

        cols = {name: arr(values, types[name], name) for name, values in self.scalars.items()}
        cols["token_ids"] = pa.ListArray.from_arrays(
            pa.array(self.token_ids_off, type=i32),
            arr(self.token_ids, _I32, "token_ids"),
            mask=pa.array([not v for v in self.token_ids_valid], type=_B),
        )
        cols["tokens"] = pa.ListArray.from_arrays(tok_off, arr(self.tokens, _S, "tokens"))
        cols["token_logprobs"] = pa.ListArray.from_arrays(
            tok_off, arr(self.lps, _F32, "token_logprobs")
        )
        cols["token_logits"] = pa.ListArray.from_arrays(
            tok_off,
            arr(self.logits, _F32, "token_logits"),
            mask=pa.array([not v for v in self.logits_valid], type=_B),
        )
        top_off = pa.array(self.top_off, type=i32)
        cols["top_logprob_tokens"] = pa.ListArray.from_arrays(
            tok_off, pa.ListArray.from_arrays(top_off, arr(self.top_tok, _S, "top_logprobs"))
        )
        cols["top_logprobs"] = pa.ListArray.from_arrays(
            tok_off, pa.ListArray.from_arrays(top_off, arr(self.top_lp, _F32, "top_logprobs"))
        )
        self._reset()
        return pa.Table.from_arrays([cols[f.name] for f in self.schema], schema=self.schema)


def tuples_table(buffer: list[tuple], schema: pa.Schema, where: str) -> pa.Table:
    """Rows given as tuples of column values (schema order) as one table."""
    cols = list(zip(*buffer))
    arrays = [
        array_or_nulls(list(col), field.type, f"{where} {field.name}")
        for col, field in zip(cols, schema)
    ]
    return pa.Table.from_arrays(arrays, schema=schema)

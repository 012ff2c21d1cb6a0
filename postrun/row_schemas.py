"""The checks of the values of worker and consolidated JSONL rows: ``SCHEMAS`` checks fields
the row types of ``contracts/rows.py`` require (``WORKER_ROWS``), ``OPTIONAL`` fields they may
lack (tests/postrun/test_jsonl_docs.py holds both to the types, and the types to the
tables of docs/formats/worker-jsonl.md and docs/formats/consolidated-jsonl.md)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from hallulog.contracts import layout
from hallulog.contracts.answer_kinds import STATUSES

__all__ = ["SCHEMAS", "OPTIONAL", "schema_errors", "MAX_SAMPLE_ID", "PROMPT_ID_RE"]


PROMPT_ID_RE = re.compile(r"^[0-9a-f]{16}$")
"""A prompt id: 16 lower-case hex digits (contracts/ids.py)."""
MAX_SAMPLE_ID = 4096
"""Sample ids are bits of a per-prompt mask here; a larger id is a schema violation."""


def _is_int(v: Any) -> bool:
    return type(v) is int or (isinstance(v, int) and not isinstance(v, bool))


def _label_ok(v: Any) -> bool:
    return v is None or v in (0, 1)


def _status_ok(v: Any) -> bool:
    return v is None or v in STATUSES


def _span_ok(v: Any) -> bool:
    return v is None or (
        isinstance(v, list)
        and len(v) == 2
        and _is_int(v[0])
        and _is_int(v[1])
        and 0 <= v[0] <= v[1]
    )


def _logprobs_ok(v: Any) -> bool:
    # a logprob is a number, or null where it was not finite (JSON has no -Infinity);
    # a plain loop: this runs once per token of every generation validated
    if not isinstance(v, list):
        return False
    for t in v:
        if not (
            isinstance(t, dict)
            and "token" in t
            and "logprob" in t
            and isinstance(t.get("top_logprobs"), list)
        ):
            return False
        lp = t["logprob"]
        if lp is not None and not isinstance(lp, (int, float)):
            return False
    return True


SEQUENCE_MODES = ("all", "prompt", "response", "last", "positions")


def _int_list_ok(v: Any) -> bool:
    return isinstance(v, list) and all(_is_int(x) and x >= 0 for x in v)


def _positions_ok(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and _int_list_ok(x) for k, x in v.items())


def _exact_span_ok(v: Any) -> bool:
    return v is None or (
        isinstance(v, dict)
        and _span_ok(v.get("chars"))
        and _span_ok(v.get("tokens"))
        and v.get("source") in ("grader", "first_line")
    )


def _positions_errors(row: dict[str, Any]) -> list[str]:
    """A positions row's fields agree: one sorted, unique ``token_positions`` entry per stored
    row, every ``positions`` row index a stored row (docs/alignment.md)."""
    pos, names = row.get("token_positions"), row.get("positions")
    if not _int_list_ok(pos) or not _positions_ok(names):
        return []  # worded by the field checks
    errs = []
    rows = row.get("num_rows", (row.get("shape") or [0, 0])[1])
    if len(pos) != rows or any(a >= b for a, b in zip(pos, pos[1:])):
        errs.append(f"token_positions {str(pos)[:60]} is not {rows} sorted unique positions")
    bad = sorted(k for k, idx in names.items() if any(j >= len(pos) for j in idx))
    if bad:
        errs.append(f"positions {bad} name rows beyond the {len(pos)} stored")
    return errs


SCHEMAS: dict[str, dict[str, Callable[[Any], bool]]] = {
    layout.PROMPT_INDEX: {
        "prompt_id": lambda v: isinstance(v, str) and bool(PROMPT_ID_RE.match(v)),
        "dataset_id": lambda v: isinstance(v, str),
        "prompt": lambda v: isinstance(v, str),
        "label": _label_ok,
        "meta": lambda v: isinstance(v, dict),
    },
    layout.GENERATIONS: {
        "prompt_id": lambda v: isinstance(v, str) and bool(PROMPT_ID_RE.match(v)),
        "sample_id": lambda v: _is_int(v) and 0 <= v < MAX_SAMPLE_ID,
        "role": lambda v: v in ("primary", "sample"),
        "text": lambda v: isinstance(v, str),
        "finish_reason": lambda v: v is None or isinstance(v, str),
        "usage": lambda v: isinstance(v, dict),
        "logprobs": _logprobs_ok,
        "token_ids": lambda v: isinstance(v, list),
        "request_params": lambda v: isinstance(v, dict),
        "generation_time_ms": _is_int,
    },
    layout.ACTIVATION_INDEX: {
        "prompt_id": lambda v: isinstance(v, str) and bool(PROMPT_ID_RE.match(v)),
        "sample_id": lambda v: _is_int(v) and 0 <= v < MAX_SAMPLE_ID,
        "activation_key": lambda v: isinstance(v, str),
        "layers": lambda v: isinstance(v, list) or v == "all",
        "sequence_mode": lambda v: v in SEQUENCE_MODES,
        "prompt_token_count": _is_int,
        "response_token_count": _is_int,
        "shape": lambda v: isinstance(v, list) and len(v) == 3 and all(map(_is_int, v)),
        "dtype": lambda v: v in ("float16", "float32", "bfloat16"),
        "size_bytes": _is_int,
        "worker_id": _is_int,
    },
    layout.ERRORS: {
        "timestamp": lambda v: isinstance(v, str),
        "error_type": lambda v: isinstance(v, str),
        "prompt_id": lambda v: v is None or isinstance(v, str),
        "sample_id": lambda v: v is None or _is_int(v),
        "error_message": lambda v: isinstance(v, str),
        "stack_trace": lambda v: isinstance(v, str),
    },
}


OPTIONAL: dict[str, dict[str, Callable[[Any], bool]]] = {
    layout.PROMPT_INDEX: {"label_status": _status_ok},
    layout.GENERATIONS: {
        "label_status": _status_ok,
        "answer_span": _span_ok,
        "reasoning": lambda v: isinstance(v, str),
        "reasoning_span": _span_ok,
        "answer_token_start": lambda v: v is None or (_is_int(v) and v >= 0),
    },
    layout.ACTIVATION_INDEX: {
        "positions": _positions_ok,
        "token_positions": _int_list_ok,
        "exact_answer_span": _exact_span_ok,
    },
}
"""Checks of fields that rows written before they existed lack: applied when present."""


def _generation_ok(row: dict[str, Any]) -> bool:
    """Every check of ``SCHEMAS[GENERATIONS]`` in one call (True: no problem)."""
    try:
        pid, sid, text, reason = (
            row["prompt_id"],
            row["sample_id"],
            row["text"],
            row["finish_reason"],
        )
        ok = (
            isinstance(pid, str)
            and PROMPT_ID_RE.match(pid) is not None
            and _is_int(sid)
            and 0 <= sid < MAX_SAMPLE_ID
            and row["role"] in ("primary", "sample")
            and isinstance(text, str)
            and (reason is None or isinstance(reason, str))
            and isinstance(row["usage"], dict)
            and isinstance(row["token_ids"], list)
            and isinstance(row["request_params"], dict)
            and _is_int(row["generation_time_ms"])
        )
        return ok and _logprobs_ok(row["logprobs"])
    except KeyError:
        return False


def _activation_ok(row: dict[str, Any]) -> bool:
    """Every check of ``SCHEMAS[ACTIVATION_INDEX]`` in one call (True: no problem)."""
    try:
        pid, sid, layers, shape = row["prompt_id"], row["sample_id"], row["layers"], row["shape"]
        return (
            isinstance(pid, str)
            and PROMPT_ID_RE.match(pid) is not None
            and _is_int(sid)
            and 0 <= sid < MAX_SAMPLE_ID
            and isinstance(row["activation_key"], str)
            and (isinstance(layers, list) or layers == "all")
            and row["sequence_mode"] in SEQUENCE_MODES
            and _is_int(row["prompt_token_count"])
            and _is_int(row["response_token_count"])
            and isinstance(shape, list)
            and len(shape) == 3
            and all(map(_is_int, shape))
            and row["dtype"] in ("float16", "float32", "bfloat16")
            and _is_int(row["size_bytes"])
            and _is_int(row["worker_id"])
        )
    except KeyError:
        return False


#: one-call checks of the big rows, equal to the per-field checks (tests/orchestrator/
#: test_validate.py compares them); the per-field loop then only runs to word the problems
_ROW_OK: dict[str, Callable[[dict[str, Any]], bool]] = {
    layout.GENERATIONS: _generation_ok,
    layout.ACTIVATION_INDEX: _activation_ok,
}


def schema_errors(name: str, row: Any) -> list[str]:
    """Field-level problems of one row of JSONL file ``name``."""
    if not isinstance(row, dict):
        return ["row is not a JSON object"]
    errs = [
        f"field {key!r} has an invalid value {str(row[key])[:60]!r}"
        for key, ok in OPTIONAL.get(name, {}).items()
        if key in row and not ok(row[key])
    ]
    if "token_positions" in row:
        errs += _positions_errors(row)
    row_ok = _ROW_OK.get(name)
    if row_ok is not None and row_ok(row):
        return errs
    for key, ok in SCHEMAS.get(name, {}).items():
        if key not in row:
            errs.append(f"missing field {key!r}")
        elif not ok(row[key]):
            errs.append(f"field {key!r} has an invalid value {str(row[key])[:60]!r}")
    return errs

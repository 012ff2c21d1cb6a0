"""The required fields of every worker and consolidated JSONL row and the checks of their
values (docs/formats/worker-jsonl.md, docs/formats/consolidated-jsonl.md)."""

from __future__ import annotations

import re
from typing import Any, Callable

from contracts import layout

__all__ = ["SCHEMAS", "schema_errors", "MAX_SAMPLE_ID"]


_HEX16 = re.compile(r"^[0-9a-f]{16}$")
MAX_SAMPLE_ID = 4096
"""Sample ids are bits of a per-prompt mask here; a larger id is a schema violation."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _label_ok(v: Any) -> bool:
    return v is None or v in (0, 1)


def _logprobs_ok(v: Any) -> bool:
    # a logprob is a number, or null where it was not finite (JSON has no -Infinity)
    return isinstance(v, list) and all(
        isinstance(t, dict) and "token" in t and "logprob" in t
        and (t["logprob"] is None or isinstance(t["logprob"], (int, float)))
        and isinstance(t.get("top_logprobs"), list) for t in v)


SCHEMAS: dict[str, dict[str, Callable[[Any], bool]]] = {
    layout.PROMPT_INDEX: {
        "prompt_id": lambda v: isinstance(v, str) and bool(_HEX16.match(v)),
        "dataset_id": lambda v: isinstance(v, str),
        "prompt": lambda v: isinstance(v, str),
        "label": _label_ok,
        "meta": lambda v: isinstance(v, dict),
    },
    layout.GENERATIONS: {
        "prompt_id": lambda v: isinstance(v, str) and bool(_HEX16.match(v)),
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
        "prompt_id": lambda v: isinstance(v, str) and bool(_HEX16.match(v)),
        "sample_id": lambda v: _is_int(v) and 0 <= v < MAX_SAMPLE_ID,
        "activation_key": lambda v: isinstance(v, str),
        "layers": lambda v: isinstance(v, list) or v == "all",
        "sequence_mode": lambda v: v in ("all", "prompt", "response", "last"),
        "prompt_token_count": _is_int,
        "response_token_count": _is_int,
        "shape": lambda v: isinstance(v, list) and len(v) == 3 and all(map(_is_int, v)),
        "dtype": lambda v: v in ("float16", "float32"),
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


def schema_errors(name: str, row: Any) -> list[str]:
    """Field-level problems of one row of JSONL file ``name``."""
    if not isinstance(row, dict):
        return ["row is not a JSON object"]
    errs = []
    for key, ok in SCHEMAS.get(name, {}).items():
        if key not in row:
            errs.append(f"missing field {key!r}")
        elif not ok(row[key]):
            errs.append(f"field {key!r} has an invalid value {str(row[key])[:60]!r}")
    return errs

"""Keep the rows of named token positions (``--positions``) from a capture.

The capture holds every position (docs/alignment.md); the rows stored are the union of the
names' positions, gathered in position order, so the store's per-generation slice stays
``(layers, rows, hidden)``. The activation index then records which row is which
(:func:`index_fields`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from hallulog.contracts.exact_answer import exact_answer_span
from hallulog.contracts.positions import ResolvedPositions, num_captured, resolve_positions
from hallulog.workers.capture import CapturedRows, CaptureError, CaptureFile, transpose_cast

__all__ = [
    "PositionRows",
    "select_positions",
    "index_fields",
    "exact_answer_spans",
    "missing_positions",
]


@dataclass
class PositionRows(CapturedRows):
    """:class:`CapturedRows` of named positions: which stored row is which."""

    resolved: ResolvedPositions | None = None
    exact_answer_span: dict | None = None


def select_positions(
    hidden: np.ndarray | CaptureFile,
    *,
    prompt_len: int,
    response_len: int,
    capture_mode: str,
    names: tuple[str, ...],
    exact_answer_span: dict | None,
    layer_index: list[int] | None,
    dtype: str,
    reasoning: tuple[int, int] | None = None,
    answer_start: int | None = 0,
) -> PositionRows:
    """``(num_tokens, num_layer_ids, hidden)`` → the named positions' rows ``(L, rows, H)``.

    ``exact_answer_span`` is :func:`hallulog.contracts.exact_answer.exact_answer_span`'s dict (its
    ``tokens`` place ``exact_answer``) or None; ``reasoning`` and ``answer_start`` a reasoning
    generation's split (:func:`hallulog.contracts.positions.resolve_positions`).
    """
    expected = num_captured(
        prompt_len=prompt_len, response_len=response_len, capture_mode=capture_mode
    )
    if hidden.shape[0] != expected:
        raise CaptureError(
            f"capture holds {hidden.shape[0]} positions for prompt {prompt_len} + "
            f"response {response_len} tokens ({capture_mode} capture: "
            f"{expected})"
        )
    span = tuple(exact_answer_span["tokens"]) if exact_answer_span else None
    resolved = resolve_positions(
        names,
        prompt_len=prompt_len,
        response_len=response_len,
        capture_mode=capture_mode,
        exact_answer=span,
        reasoning=reasoning,
        answer_start=answer_start,
    )
    pos = resolved.positions
    if pos and resolved.contiguous:
        rows = hidden[pos[0] : pos[-1] + 1]
    else:  # a gather: a copy of the few rows kept, then cast like any slice
        rows = hidden[np.asarray(pos, np.intp)]
    acts = transpose_cast(rows, layer_index, dtype)
    prompt_rows = sum(1 for p in pos if p < prompt_len)
    return PositionRows(
        acts=acts,
        row0_position=pos[0] if pos else prompt_len - 1,
        prompt_rows=prompt_rows,
        response_rows=len(pos) - prompt_rows,
        resolved=resolved,
        exact_answer_span=exact_answer_span,
    )


def index_fields(rows: PositionRows) -> dict[str, Any]:
    """The activation index fields of a positions run: ``positions``, ``token_positions``,
    ``exact_answer_span`` (docs/formats/worker-jsonl.md)."""
    resolved = rows.resolved
    assert resolved is not None
    return {
        "positions": {name: list(idx) for name, idx in resolved.rows.items()},
        "token_positions": list(resolved.positions),
        "exact_answer_span": rows.exact_answer_span,
    }


def exact_answer_spans(completions, grades, starts=None) -> list[dict | None]:
    """Each completion's exact answer (:func:`hallulog.contracts.exact_answer.exact_answer_span`): its
    grade's match (``Grade.span``) when there is one, else the first-line rule.

    ``starts``: each completion's first answer token (a reasoning generation's; None: no
    answer, so no span): the span is found among the answer's tokens and its ``tokens`` are
    offset by the start, so they index the response tokens."""
    out = []
    for i, (comp, grade) in enumerate(zip(completions, grades)):
        start = starts[i] if starts is not None else 0
        if start is None:
            out.append(None)
            continue
        span = exact_answer_span(
            comp.text,
            [t.get("token") for t in (comp.logprobs or [])[start:]],
            grade.span if grade is not None else None,
        )
        if span is not None and start:
            span["tokens"] = [span["tokens"][0] + start, span["tokens"][1] + start]
        out.append(span)
    return out


def missing_positions(records) -> dict[str, int]:
    """Per position name, how many of a group's stored generations it does not exist for (its
    row list empty: ``slt`` of a one-token answer, ``exact_answer`` without a span)."""
    out: dict[str, int] = {}
    for rec in records:
        for name, idx in (rec.activation_row.get("positions") or {}).items():
            if not idx:
                out[name] = out.get(name, 0) + 1
    return out

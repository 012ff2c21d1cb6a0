"""Which rows a capture file holds: the request field, the file's ``row0``, and what a worker asks
for (docs/contracts.md, "Capture file").

A capture request may carry ``kv_transfer_params["hallulog_capture_rows"]``; the server then
writes only those positions of the request's sequence (it alone knows the prompt length P of a
chat request) and records the absolute position of the file's row 0 in the safetensors
``__metadata__`` as ``{"row0": "52"}`` (metadata values are strings). A file without ``row0``
starts at position 0: servers that ignore the field (upstream vLLM, older hallulog) write every
position, as before.

| value | positions of a capture of n positions |
|---|---|
| ``"all"`` (the default) | 0 .. n-1 |
| ``"prompt"`` | 0 .. P-1 |
| ``"response"`` | P-1 .. n-1: the last prompt token, then the response tokens captured |
| ``"last"`` | n-1 |
| an integer k >= 0 | min(k, n-1) .. n-1 |

An integer is for the prefill-only request, whose prompt is prompt + response: the worker knows
where the response starts there, the server does not.

```python
from hallulog.contracts.capture_rows import capture_span, rows_to_ask
capture_span("response", prompt_len=48, num_tokens=59)        # (47, 59)
rows_to_ask(sequence_mode="all", positions=("tbg", "slt", "exact_answer"))  # "response"
```

Only :mod:`contracts` may be imported here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hallulog.contracts.positions import WINDOW_KINDS

__all__ = [
    "CAPTURE_ROWS_FIELD",
    "CAPTURE_ROWS",
    "ROW0_KEY",
    "check_capture_rows",
    "capture_window",
    "capture_span",
    "row0_metadata",
    "rows_to_ask",
    "prefill_start",
]

CAPTURE_ROWS_FIELD = "hallulog_capture_rows"
"""The key in a request's ``kv_transfer_params``."""
CAPTURE_ROWS = ("all", "prompt", "response", "last")
"""The named values (an integer k >= 0 is the other kind)."""
ROW0_KEY = "row0"
"""The key in a capture file's safetensors ``__metadata__``: the position of its row 0."""

#: where a ``last`` capture starts before its length is known: past any sequence
_PAST_THE_END = 1 << 62


def check_capture_rows(value: Any) -> str | int:
    """``value`` as a capture-rows selection (None is ``"all"``); ValueError if it is none."""
    if value is None:
        return "all"
    if isinstance(value, str) and value in CAPTURE_ROWS:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(
        f"kv_transfer_params.{CAPTURE_ROWS_FIELD}: expected one of "
        f"{', '.join(CAPTURE_ROWS)} or a position >= 0, got {value!r}"
    )


def capture_window(value: Any, prompt_len: int) -> tuple[int, int | None]:
    """The positions ``[start, stop)`` a capture keeps, known before the sequence ends: ``stop``
    None is the end; a ``start`` past the end means the last position (:func:`capture_span`)."""
    value = check_capture_rows(value)
    if value == "prompt":
        return 0, prompt_len
    if value == "response":
        return max(prompt_len - 1, 0), None
    if value == "last":
        return _PAST_THE_END, None
    return (0 if value == "all" else value), None


def capture_span(value: Any, *, prompt_len: int, num_tokens: int) -> tuple[int, int]:
    """The positions ``[start, stop)`` a file holds of a capture of ``num_tokens`` positions
    whose request had ``prompt_len`` prompt tokens (at least one position, the last, when any)."""
    start, stop = capture_window(value, prompt_len)
    stop = num_tokens if stop is None else min(stop, num_tokens)
    start = min(start, max(num_tokens - 1, 0))
    return start, max(start, stop)


def row0_metadata(metadata: Mapping[str, str] | None) -> int:
    """The ``row0`` of a file's safetensors ``__metadata__`` (0 when absent); ValueError when
    it is not a non-negative integer."""
    text = (metadata or {}).get(ROW0_KEY)
    if text is None:
        return 0
    if not isinstance(text, str) or not text.isdigit():
        raise ValueError(f"__metadata__ {ROW0_KEY} is {text!r}, not a position")
    return int(text)


#: positions at or after P-1 whatever the response: a ``response`` capture holds them
_RESPONSE_SIDE = {
    "tbg",
    "slt",
    "exact_answer",
    "last",
    "response",
    "last:1",
    "answer_first",
    "answer_last",
    "reasoning_last",
    "reasoning",
}


def rows_to_ask(*, sequence_mode: str, positions: tuple[str, ...] | None) -> str:
    """The narrowest selection a generation request can ask for, before P and R are known.

    Without positions the sequence mode's own rows (the modes mirror the values). With them:
    ``last`` when every name is the last position; ``response`` when every name lies at or after
    P-1 (``tbg``, ``slt``, ``exact_answer``, ``last``, ``response``, ``first:K``, the answer and
    reasoning names); ``prompt``
    when every name lies in the prompt (``prompt``, ``tbg``); else ``all`` (``all``, a mix of
    prompt and response, ``last:K`` with K > 1, which reaches into the prompt when K > R).
    """
    if not positions:
        return sequence_mode if sequence_mode in CAPTURE_ROWS else "all"
    names = set(positions)
    if names <= {"last", "last:1"}:
        return "last"
    if all(n in _RESPONSE_SIDE or n.split(":")[0] == WINDOW_KINDS[0] for n in names):
        return "response"
    if names <= {"prompt", "tbg"}:
        return "prompt"
    return "all"


def prefill_start(asked: str, *, prompt_len: int, response_len: int) -> int:
    """A prefill-only request's selection for what a generation request would ask (``asked``):
    its prompt is prompt + response, so ``response`` and ``last`` become the position they
    start at (P-1, P+R-1); ``all`` and ``prompt`` every position (0)."""
    if asked == "response":
        return prompt_len - 1
    if asked == "last":
        return prompt_len + response_len - 1
    return 0

"""The positions a capture file holds: ``kv_transfer_params["hallulog_capture_rows"]``.

The rule of hallulog's ``contracts/capture_rows.py`` (docs/contracts.md, "Capture file"),
restated here because the plugin imports nothing of hallulog (it runs inside vLLM's processes);
``tests/vllm/test_capture_rows_vllm.py`` checks that the two agree. No vLLM import either.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CAPTURE_ROWS_FIELD", "ROW0_KEY", "capture_span", "block_span"]

CAPTURE_ROWS_FIELD = "hallulog_capture_rows"
ROW0_KEY = "row0"


def capture_span(value: Any, prompt_len: int, num_tokens: int) -> tuple[int, int] | None:
    """Positions ``[start, stop)`` of a capture of ``num_tokens`` positions to write for
    ``value`` (``all``, ``prompt``, ``response``, ``last`` or a position k >= 0; None is
    ``all``), or None when ``value`` is none of them."""
    n = num_tokens
    if value is None or value == "all":
        start, stop = 0, n
    elif value == "prompt":
        start, stop = 0, min(prompt_len, n)
    elif value == "response":
        start, stop = max(prompt_len - 1, 0), n
    elif value == "last":
        start, stop = n - 1, n
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        start, stop = value, n
    else:
        return None
    start = max(min(start, n - 1), 0)
    return start, max(start, stop)


def block_span(start: int, stop: int, block_size: int) -> tuple[int, int, int]:
    """The whole blocks holding positions ``[start, stop)``: (first block, end block, the
    position of the first block's first slot)."""
    first = start // block_size
    return first, -(-stop // block_size), first * block_size

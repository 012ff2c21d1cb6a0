"""The worker's check of a capture before it is stored: rows that are all zeros, non-finite, or
repeated across different tokens fail the capture (the rule: ``contracts/capture_check.py``).

```python
from hallulog.workers.capture_check import check_captured, capture_reasons
check_captured(rows, token_ids=prompt_ids + response_ids[:-1], layer_ids=(0, 8, 16))
# raises CaptureRowsError (a CaptureError) with .reason ("capture_zeros", ...)
capture_reasons(errors)   # {"capture_zeros": 2} of a group's errors.jsonl rows
```

A failed check is a capture failure like any other (the generation is kept without activations,
``errors.jsonl`` gets a ``capture_failed`` row, with ``reason``); ``--check-captures false``
turns it off.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from hallulog.contracts.capture_check import REASONS, RowFault, check_rows
from hallulog.workers.capture import CapturedRows, CaptureError

__all__ = ["CaptureRowsError", "check_captured", "capture_reasons", "REASONS"]


class CaptureRowsError(CaptureError):
    """A capture whose rows fail the check; ``reason`` is the first fault's."""

    def __init__(self, faults: list[RowFault]) -> None:
        self.faults = faults
        self.reason = faults[0].reason
        super().__init__("; ".join(f.describe() for f in faults))


def check_captured(
    rows: CapturedRows, *, token_ids: Sequence[int], layer_ids: Sequence[int]
) -> None:
    """Raise :class:`CaptureRowsError` when ``rows`` (cast, as they would be stored) has a row
    that fails. ``token_ids``: the id at every position the capture covers (row ``j`` sits at
    position ``row0_position + j``, or ``resolved.positions[j]`` for named positions)."""
    resolved = getattr(rows, "resolved", None)
    num_rows = rows.acts.shape[1]
    if resolved is not None:
        positions = np.asarray(resolved.positions, np.intp)
    else:
        positions = np.arange(rows.row0_position, rows.row0_position + num_rows)
    ids = np.asarray(token_ids)[positions] if num_rows > 1 else None
    faults = check_rows(rows.acts, layer_ids=layer_ids, token_ids=ids)
    if faults:
        raise CaptureRowsError(faults)


def capture_reasons(errors: Iterable[dict[str, Any]]) -> dict[str, int]:
    """How many of these ``errors.jsonl`` rows have each reason (rows without one left out)."""
    out: dict[str, int] = {}
    for err in errors:
        reason = err.get("reason")
        if reason:
            out[reason] = out.get(reason, 0) + 1
    return out

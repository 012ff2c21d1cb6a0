"""Which stored activation rows are a failed capture: the rule the worker applies before it
stores a capture and ``validate --deep`` applies to every row already stored (docs/alignment.md,
"Captures that are checked").

```python
from hallulog.contracts.capture_check import check_rows
faults = check_rows(acts, layer_ids=[0, 1, 2], token_ids=ids_of_the_rows)  # acts (L, T, H)
faults[0].reason, faults[0].rows, faults[0].describe()    # [] when every row is fine
```

A row is one layer's hidden state at one token position (``acts[l, t]``). Reasons, in the
order they are reported:

- ``capture_nonfinite``: a NaN or an infinity anywhere in the row (any layer; an overflow of
  the cast into float16 included, since the rows checked are the stored ones);
- ``capture_zeros``: every value of the row is zero (``-0.0`` included);
- ``capture_constant``: the row equals the previous stored row of the same layer bit for bit
  while the two rows' token ids differ (a backend that repeats one state for every token).

A row is counted under its first reason only.

Layer id 0 (the embedding output) is left out of ``capture_zeros`` and ``capture_constant``: its
row *is* the token's embedding row, and some models have all-zero or shared rows for untrained
tokens; the deep audit compares layer 0 with the embedding matrix instead.

Cost: one pass over the rows' bits for the non-finite test (16-bit rows as ``uint16``, float32
rows with ``np.isfinite``), then the zero and constant tests on each row's first 8 bytes, the
full row compared only where those match (bench/bench_capture_check.py, docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["REASONS", "RowFault", "check_rows"]

NONFINITE, ZEROS, CONSTANT = "capture_nonfinite", "capture_zeros", "capture_constant"
REASONS: tuple[str, ...] = (NONFINITE, ZEROS, CONSTANT)
"""The reasons, in the order :func:`check_rows` reports them."""

#: exponent bits of each 16-bit float (all ones: an infinity or a NaN), and the magnitude bits
_EXPONENT_16 = {"float16": 0x7C00, "bfloat16": 0x7F80}
_MAGNITUDE = {2: 0x7FFF, 4: 0x7FFFFFFF, 8: 0x7FFFFFFFFFFFFFFF}
_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass(frozen=True)
class RowFault:
    """The rows of one activation that fail for one reason."""

    reason: str
    """``capture_nonfinite``, ``capture_zeros`` or ``capture_constant``."""
    rows: int
    """How many (layer, token) rows fail."""
    layer_id: int
    """The first failing row's layer id."""
    row: int
    """The first failing row's index among the stored rows (0-based)."""

    def describe(self) -> str:
        what = {
            NONFINITE: "hold a NaN or an infinity",
            ZEROS: "are all zeros",
            CONSTANT: "repeat the previous token's row for a different token",
        }[self.reason]
        return f"{self.reason}: {self.rows} row(s) {what} (first: layer {self.layer_id}, row {self.row})"


def check_rows(
    acts: np.ndarray, *, layer_ids: Sequence[int], token_ids: Sequence[int] | np.ndarray | None
) -> list[RowFault]:
    """The faults of ``acts`` ``(layers, rows, hidden)`` (float16, bfloat16 or float32; C
    order), one per reason found, in :data:`REASONS` order; ``[]`` when every row is fine.

    ``layer_ids[l]`` is the layer id of ``acts[l]``; ``token_ids[t]`` the token id at row
    ``t``'s position (None: the constant test is skipped).
    """
    if acts.ndim != 3 or acts.shape[0] != len(layer_ids):
        raise ValueError(f"acts of shape {acts.shape} for {len(layer_ids)} layer ids")
    if token_ids is not None and len(token_ids) != acts.shape[1]:
        raise ValueError(f"{len(token_ids)} token ids for {acts.shape[1]} rows")
    if acts.size == 0:
        return []
    acts = np.ascontiguousarray(acts)
    faults = []
    flagged = _nonfinite(acts)
    if flagged is not None:
        faults.append(_fault(NONFINITE, flagged, layer_ids))
    else:
        flagged = np.zeros(acts.shape[:2], bool)
    checked = np.asarray([lid != 0 for lid in layer_ids])  # layer id 0: the embedding's own row
    if not checked.any():
        return faults
    bits = acts.view(_UINT[acts.dtype.itemsize])
    magnitude = bits.dtype.type(_MAGNITUDE[acts.dtype.itemsize])
    heads = _heads(bits, magnitude)
    zero = (heads == 0) & checked[:, None]  # candidates: the first 8 bytes are zero
    if zero.any():
        zero[zero] = ~np.bitwise_and(bits[zero], magnitude).any(axis=-1)
        if zero.any():
            faults.append(_fault(ZEROS, zero, layer_ids))
            flagged |= zero
    if token_ids is not None and acts.shape[1] > 1:
        ids = np.asarray(token_ids)
        same = np.zeros(acts.shape[:2], bool)
        pairs = (heads[:, 1:] == heads[:, :-1]) & (ids[1:] != ids[:-1]) & checked[:, None]
        pairs &= ~flagged[:, 1:]  # a row already failed is not counted twice
        if pairs.any():  # candidates: the first 8 bytes repeat; the whole row must
            same[:, 1:][pairs] = (bits[:, 1:][pairs] == bits[:, :-1][pairs]).all(axis=-1)
            if same.any():
                faults.append(_fault(CONSTANT, same, layer_ids))
    return faults


def _fault(reason: str, mask: np.ndarray, layer_ids: Sequence[int]) -> RowFault:
    layer, row = (int(x[0]) for x in np.nonzero(mask))
    return RowFault(reason, int(mask.sum()), int(layer_ids[layer]), row)


def _nonfinite(acts: np.ndarray) -> np.ndarray | None:
    """``(layers, rows)`` mask of the rows holding a NaN or an infinity, or None (the usual
    case, decided in one pass: the per-row mask is computed only when there is one)."""
    exponent = _EXPONENT_16.get(acts.dtype.name)
    if exponent is not None:  # numpy's isfinite on float16 goes element by element
        bits = np.bitwise_and(acts.view(np.uint16), np.uint16(exponent))
        if bits.max() != exponent:
            return None
        return (bits == exponent).any(axis=-1)
    finite = np.isfinite(acts)
    if finite.all():
        return None
    return ~finite.all(axis=-1)


def _heads(bits: np.ndarray, magnitude) -> np.ndarray:
    """``(layers, rows)``: each row's first 8 bytes as one integer (its first element when the
    row is narrower), sign bits cleared: zero for an all-zero row, equal for equal rows."""
    per_word = 8 // bits.dtype.itemsize
    if bits.shape[2] < per_word:
        return np.bitwise_and(bits[..., 0], magnitude)
    word = int(magnitude)
    for _ in range(per_word - 1):
        word = (word << (8 * bits.dtype.itemsize)) | int(magnitude)
    head = bits[..., :per_word].view(np.uint64)[..., 0]
    return np.bitwise_and(head, np.uint64(word))

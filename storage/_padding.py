"""Zeroing the padding of a reused batch buffer: only where an earlier batch left bytes.

A padded ``(B, k, T_max, H)`` batch of random samples is about half padding (16-256 tokens per
sample), and zeroing all of it every batch costs about as much as reading the data. A buffer
that is reused keeps zeros wherever the batches before it had padding too, so each buffer
carries the flat element ranges that may hold stale bytes (:class:`StaleRanges`), and a new
batch zeroes only the part of its padding that overlaps them.
"""

from __future__ import annotations

import numpy as np

__all__ = ["StaleRanges"]


class StaleRanges:
    """Flat element ranges ``[start, end)`` of one buffer that may hold non-zero bytes."""

    def __init__(self, size: int) -> None:
        # a buffer nobody has written yet is uninitialised memory: all of it may be stale
        self.starts = np.array([0], np.int64)
        self.ends = np.array([int(size)], np.int64)

    def zero_padding(
        self, flat: np.ndarray, seq_len: np.ndarray, k: int, t_max: int, hidden: int
    ) -> None:
        """Make ``flat`` (the buffer's first ``B*k*t_max*hidden`` elements, read as
        ``(B, k, t_max, hidden)``) zero past each sample's ``seq_len`` rows, and record that
        the data rows are stale from now on (the caller fills them next)."""
        b = len(seq_len)
        need = b * k * t_max * hidden
        row = t_max * hidden
        bases = np.arange(b * k, dtype=np.int64) * row
        data_ends = bases + np.repeat(seq_len.astype(np.int64), k) * hidden
        pad_ends = bases + row
        lo = np.searchsorted(self.ends, data_ends, side="right")
        hi = np.searchsorted(self.starts, pad_ends, side="left")
        for p in np.flatnonzero(hi > lo):  # segments whose padding meets a stale range
            for i in range(lo[p], hi[p]):
                a = max(int(data_ends[p]), int(self.starts[i]))
                e = min(int(pad_ends[p]), int(self.ends[i]))
                if a < e:
                    flat[a:e] = 0
        keep = self.ends > need  # stale ranges beyond this batch stay stale
        tail_starts = np.maximum(self.starts[keep], need)
        full = data_ends > bases
        self.starts = np.concatenate([bases[full], tail_starts])
        self.ends = np.concatenate([data_ends[full], self.ends[keep]])

"""Packing sequences into bins: first-fit-decreasing, and one bin's arrays (seed 004 §1.2)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["materialize_bin_arrays", "first_fit_decreasing"]


def materialize_bin_arrays(
    read_sequence: Callable[[int], tuple[np.ndarray, np.ndarray]],
    seq_indices: Sequence[int],
    pack_size: int,
    scratch_input_ids: np.ndarray,
    scratch_loss_mask: np.ndarray,
) -> tuple[int, np.ndarray]:
    """Seed 004 §1.2: concatenate a bin's sequences into the scratch buffers (truncating at
    ``pack_size``), then roll the loss mask right by one (position 0 gets 0). Returns
    ``(packed_len, seq_start_id)``; ``seq_start_id[0] == 0``, strictly increasing, ``< packed_len``."""
    scratch_input_ids[:] = 0
    scratch_loss_mask[:] = 0
    pos = 0
    starts = []
    for k in seq_indices:
        ids, mask = read_sequence(int(k))
        n = min(len(ids), pack_size, pack_size - pos)
        if n <= 0:
            break
        starts.append(pos)
        scratch_input_ids[pos : pos + n] = ids[:n]
        scratch_loss_mask[pos : pos + n] = mask[:n]
        pos += n
    if pos > 0:
        scratch_loss_mask[1:pos] = scratch_loss_mask[: pos - 1].copy()
        scratch_loss_mask[0] = 0
    return pos, np.asarray(starts, dtype=np.uint32)


def first_fit_decreasing(lengths: Sequence[int], pack_size: int) -> list[list[int]]:
    """Bins of sequence indices: longest first, each into the first bin it fits (lengths are
    capped at ``pack_size``: a longer sequence gets a bin of its own and is truncated)."""
    lengths = np.minimum(np.asarray(lengths, np.int64), pack_size)
    order = np.argsort(-lengths, kind="stable")
    remaining = np.empty(max(1, len(lengths)), np.int64)
    bins: list[list[int]] = []
    for k in order:
        n = int(lengths[k])
        fits = np.flatnonzero(remaining[: len(bins)] >= n)
        if len(fits):
            b = int(fits[0])
        else:
            b = len(bins)
            bins.append([])
            remaining[b] = pack_size
        bins[b].append(int(k))
        remaining[b] -= n
    return bins

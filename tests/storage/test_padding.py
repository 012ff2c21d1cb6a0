"""StaleRanges: a reused batch buffer zeroes only stale padding, and every padding byte is 0."""

from __future__ import annotations

import numpy as np
from hallulog.storage._padding import StaleRanges


def test_reused_buffer_has_zero_padding_in_every_batch():
    rng = np.random.default_rng(0)
    hidden, k, cap = 8, 2, 4 * 2 * 40 * 8
    flat = rng.integers(1, 100, cap).astype(np.float16)  # garbage, as torch.empty gives
    stale = StaleRanges(cap)
    zeroed = 0
    for _ in range(300):
        b = int(rng.integers(0, 5))
        seq = rng.integers(0, 41, b)
        t_max = int(seq.max()) if b else 0
        need = b * k * t_max * hidden
        before = flat.copy()
        stale.zero_padding(flat[:need], seq, k, t_max, hidden)
        zeroed += int(np.count_nonzero(before[:need] != flat[:need]))
        acts = flat[:need].reshape(b, k, t_max, hidden)
        for j, t in enumerate(seq):
            assert not acts[j, :, t:].any()  # padding: zeros
            acts[j, :, :t] = rng.integers(1, 100, (k, int(t), hidden))  # the reader's data
        # what the old code wrote: the same buffer with all of the padding zeroed
        reference = before[:need].reshape(b, k, t_max, hidden).copy()
        for j, t in enumerate(seq):
            reference[j, :, t:] = 0
            reference[j, :, :t] = acts[j, :, :t]
        assert np.array_equal(reference, acts)
    assert zeroed > 0


def test_only_stale_padding_is_written():
    hidden, k = 4, 1
    flat = np.ones(2 * 10 * hidden, np.float32)
    stale = StaleRanges(flat.size)
    seq = np.array([10, 3])
    stale.zero_padding(flat, seq, k, 10, hidden)  # all stale at first: padding zeroed
    assert not flat[10 * hidden + 3 * hidden :].any()
    flat[: 10 * hidden] = 7  # data of sample 0
    flat[10 * hidden : 13 * hidden] = 7  # data of sample 1
    # the same layout again, shorter second sample: only rows 2..3 of it were stale
    writes = []

    class Spy(np.ndarray):
        def __setitem__(self, key, value):
            writes.append((key.start, key.stop))
            super().__setitem__(key, value)

    stale.zero_padding(flat.view(Spy), np.array([10, 2]), k, 10, hidden)
    assert writes == [(12 * hidden, 13 * hidden)]
    assert not flat[12 * hidden :].any() and (flat[: 12 * hidden] == 7).all()

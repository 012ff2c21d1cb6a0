"""The training layer draw: a pure function of (seed, epoch, index), distinct, uniform."""

from __future__ import annotations

import numpy as np
import pytest
from hallulog.storage._layer_draw import draw_layers


def test_a_sample_gets_the_same_layers_in_any_batch():
    whole = draw_layers(3, 1, np.arange(500), 32, 2)
    assert whole.shape == (500, 2) and whole.dtype == np.int64
    assert (draw_layers(3, 1, [7, 499, 0], 32, 2) == whole[[7, 499, 0]]).all()
    assert (draw_layers(3, 1, [42], 32, 2)[0] == whole[42]).all()
    assert (whole[:, 0] != whole[:, 1]).all() and whole.min() >= 0 and whole.max() < 32
    assert (draw_layers(3, 2, np.arange(500), 32, 2) != whole).any(axis=1).mean() > 0.9
    assert (draw_layers(4, 1, np.arange(500), 32, 2) != whole).any(axis=1).mean() > 0.9


def test_every_ordered_pair_of_layers_is_equally_likely():
    d = draw_layers(7, 2, np.arange(200_000), 8, 2)
    counts = np.bincount(d[:, 0] * 8 + d[:, 1], minlength=64).reshape(8, 8)
    assert (np.diag(counts) == 0).all()
    observed = counts[~np.eye(8, dtype=bool)]
    expected = observed.sum() / observed.size
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 93.2, chi2  # the 0.999 quantile of chi-square with 55 degrees of freedom


def test_all_layers_and_bad_counts():
    full = draw_layers(0, 0, np.arange(100), 5, 5)
    assert (np.sort(full, axis=1) == np.arange(5)).all()
    assert draw_layers(0, 0, [], 5, 2).shape == (0, 2)
    with pytest.raises(ValueError, match="3 distinct layers out of 2"):
        draw_layers(0, 0, [1], 2, 3)

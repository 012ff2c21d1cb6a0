"""The capture check's rule on planted rows: all zeros, non-finite, repeated across different
tokens; layer id 0 exempt from the zero and repeat tests; each dtype a store holds."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hallulog.contracts.capture_check import REASONS, check_rows

DTYPES = [np.float16, np.float32, ml_dtypes.bfloat16]
LAYERS = [0, 4, 8]


def _acts(dtype, rows: int = 6, hidden: int = 16, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((len(LAYERS), rows, hidden)).astype(dtype)


def _reasons(faults) -> dict[str, int]:
    return {f.reason: f.rows for f in faults}


@pytest.mark.parametrize("dtype", DTYPES)
def test_real_looking_rows_pass(dtype):
    for seed in range(5):
        acts = _acts(dtype, rows=40, hidden=64, seed=seed)
        assert check_rows(acts, layer_ids=LAYERS, token_ids=np.arange(40)) == []


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_in_dimension_0_of_every_row_is_nonfinite(dtype):
    acts = _acts(dtype)
    acts[:, :, 0] = np.nan
    faults = check_rows(acts, layer_ids=LAYERS, token_ids=np.arange(6))
    assert [(f.reason, f.rows, f.layer_id, f.row) for f in faults] == [
        ("capture_nonfinite", 18, 0, 0)
    ]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
def test_one_nonfinite_value_anywhere(dtype, value):
    acts = _acts(dtype)
    acts[2, 4, 13] = value
    faults = check_rows(acts, layer_ids=LAYERS, token_ids=np.arange(6))
    assert [(f.reason, f.rows, f.layer_id, f.row) for f in faults] == [
        ("capture_nonfinite", 1, 8, 4)
    ]


def test_float16_overflow_of_a_cast_is_caught():
    wide = np.full((1, 2, 8), 1.0, np.float32)
    wide[0, 1, 3] = 1e6  # beyond float16's range: the store would hold an infinity
    with np.errstate(over="ignore"):
        stored = wide.astype(np.float16)
    assert _reasons(check_rows(stored, layer_ids=[3], token_ids=[5, 6])) == {"capture_nonfinite": 1}


@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_rows_outside_layer_0(dtype):
    acts = _acts(dtype)
    acts[0] = 0.0  # layer id 0: the embedding's own row, left to the embedding audit
    acts[1, 3] = 0.0
    acts[2, 5] = -0.0
    faults = check_rows(acts, layer_ids=LAYERS, token_ids=np.arange(6))
    assert [(f.reason, f.rows, f.layer_id, f.row) for f in faults] == [("capture_zeros", 2, 4, 3)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_row_zero_but_in_its_last_value_passes(dtype):
    acts = _acts(dtype)
    acts[1, 2, :-1] = 0.0
    acts[1, 2, -1] = 1.0
    acts[2, 2, :4] = 0.0  # its first 8 bytes (or more) zero, the rest not
    assert check_rows(acts, layer_ids=LAYERS, token_ids=np.arange(6)) == []


@pytest.mark.parametrize("dtype", DTYPES)
def test_constant_rows_across_different_tokens(dtype):
    acts = _acts(dtype)
    acts[:, 1:] = acts[:, :1]  # a backend that repeats one state for every token
    faults = check_rows(acts, layer_ids=LAYERS, token_ids=[7, 8, 9, 10, 11, 12])
    assert [(f.reason, f.rows, f.layer_id, f.row) for f in faults] == [
        ("capture_constant", 10, 4, 1)
    ]


def test_equal_rows_of_equal_tokens_and_near_copies_pass():
    acts = _acts(np.float16)
    acts[:, 3] = acts[:, 2]
    acts[1, 5] = acts[1, 4]
    acts[1, 5, -1] += 1  # the same but in its last value
    acts[2, 1] = -acts[2, 0]  # the same magnitudes, other signs
    assert check_rows(acts, layer_ids=LAYERS, token_ids=[1, 2, 3, 3, 4, 5]) == []
    assert check_rows(acts, layer_ids=LAYERS, token_ids=None) == []  # no ids: no repeat test
    assert _reasons(check_rows(acts, layer_ids=LAYERS, token_ids=[1, 2, 3, 4, 5, 6])) == {
        "capture_constant": 2
    }


def test_a_row_counts_under_its_first_reason_only():
    acts = _acts(np.float32)
    acts[1] = 0.0  # zero rows repeat each other too
    acts[2, :, 5] = np.nan
    faults = check_rows(acts, layer_ids=LAYERS, token_ids=np.arange(6))
    assert _reasons(faults) == {"capture_nonfinite": 6, "capture_zeros": 6}
    assert [f.reason for f in faults] == [r for r in REASONS if r in _reasons(faults)]
    assert "capture_zeros: 6 row(s) are all zeros (first: layer 4, row 0)" in [
        f.describe() for f in faults
    ]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 2, 3, 5])
def test_narrow_rows(dtype, hidden):
    acts = _acts(dtype, hidden=hidden) + 3
    assert check_rows(acts, layer_ids=LAYERS, token_ids=np.arange(6)) == []
    acts[1, 2] = 0.0
    acts[2, 4] = acts[2, 3]
    acts[2, 0, 0] = np.nan
    assert _reasons(check_rows(acts, layer_ids=LAYERS, token_ids=np.arange(6))) == {
        "capture_nonfinite": 1,
        "capture_zeros": 1,
        "capture_constant": 1,
    }


def test_shapes_checked_and_empty_captures_pass():
    acts = _acts(np.float16)
    with pytest.raises(ValueError, match="layer ids"):
        check_rows(acts, layer_ids=[1, 2], token_ids=None)
    with pytest.raises(ValueError, match="token ids"):
        check_rows(acts, layer_ids=LAYERS, token_ids=[1, 2])
    assert check_rows(acts[:, :0], layer_ids=LAYERS, token_ids=[]) == []
    one = acts[:, :1].copy()
    assert check_rows(one, layer_ids=LAYERS, token_ids=[4]) == []
    assert check_rows(acts[:, ::2], layer_ids=LAYERS, token_ids=[1, 2, 3]) == []  # not C order

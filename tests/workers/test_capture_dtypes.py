"""The worker's cast into the store dtype (``hallulog.workers.capture.transpose_cast``), bfloat16 stores."""

import hallulog.workers.capture as capture
import ml_dtypes
import numpy as np
import pytest
from hallulog.workers.capture import TORCH_CAST_MIN, select_rows, transpose_cast

BF16 = np.dtype(ml_dtypes.bfloat16)


def _all_bf16(tokens: int, layers: int = 6, hidden: int = 600) -> np.ndarray:
    """Random bfloat16 words: every bit pattern, NaNs with payloads and infinities included."""
    rng = np.random.default_rng(tokens)
    return (
        rng.integers(0, 2**16, (tokens, layers, hidden), dtype=np.uint64)
        .astype(np.uint16)
        .view(BF16)
    )


@pytest.mark.parametrize("layer_index", [None, [0, 2, 5], [-1]])
@pytest.mark.parametrize("tokens", [3, 300])  # 300 x 6 x 600: above TORCH_CAST_MIN
def test_bfloat16_capture_into_bfloat16_store_is_copied_not_cast(monkeypatch, layer_index, tokens):
    """A bf16 model's capture into a bfloat16 store: the selected rows' bytes, transposed, every
    bit kept (NaN payloads too); neither torch nor a numpy cast runs."""
    hidden = _all_bf16(tokens)
    hidden.flags.writeable = False  # as a mapped capture file is
    monkeypatch.setattr(
        capture, "_torch_copy", lambda *a: pytest.fail("bf16 -> bf16 went through torch")
    )
    got = transpose_cast(hidden, layer_index, "bfloat16")
    want = hidden if layer_index is None else hidden[:, layer_index, :]
    want = np.ascontiguousarray(want.view(np.uint16).transpose(1, 0, 2))
    assert got.dtype == BF16 and got.flags.c_contiguous and got.shape == want.shape
    assert got.view(np.uint16).tobytes() == want.tobytes()


@pytest.mark.parametrize("src", ["float32", "float16"])
@pytest.mark.parametrize("tokens", [3, 300])
def test_cast_into_bfloat16_rounds_as_ml_dtypes(src, tokens):
    """float32 (the embedded server's default) or float16 captures into a bfloat16 store: round
    to nearest even, bit-identical to ml_dtypes' cast for every non-NaN value (torch for large
    casts); a NaN stays a NaN."""
    rng = np.random.default_rng(tokens)
    width = 32 if src == "float32" else 16
    bits = rng.integers(0, 2**width, (tokens, 6, 600), dtype=np.uint64).astype(f"<u{width // 8}")
    hidden = bits.view(src).copy()
    edges = (
        [np.inf, -np.inf, 3.3961e38, 1.0039062, 1.0117188, -0.0, 9.2e-41, 1e-45]
        if src == "float32"
        else [np.inf, -np.inf, 65504.0, 1.0039062, -0.0, 6e-8, 1.0, 2.0]
    )
    hidden[-1, 0, : len(edges)] = edges
    with np.errstate(over="ignore", invalid="ignore"):
        want = np.ascontiguousarray(hidden[:, [5, 1]].transpose(1, 0, 2).astype(BF16))
        got = transpose_cast(hidden, [5, 1], "bfloat16")
    assert got.dtype == BF16 and got.shape == want.shape and got.flags.c_contiguous
    nan_got, nan_want = np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32))
    assert np.array_equal(nan_got, nan_want)
    assert got.view(np.uint16)[~nan_got].tobytes() == want.view(np.uint16)[~nan_want].tobytes()
    if tokens == 300:
        assert got.size >= TORCH_CAST_MIN


def test_select_rows_keeps_a_bfloat16_capture_as_it_is():
    hidden = _all_bf16(9, layers=3, hidden=4)
    rows = select_rows(
        hidden,
        prompt_len=5,
        response_len=4,
        sequence_mode="response",
        layer_index=None,
        dtype="bfloat16",
    )
    assert rows.acts.dtype == BF16 and rows.row0_position == 4 and rows.prompt_rows == 1
    assert (
        rows.acts.view(np.uint16).tobytes()
        == np.ascontiguousarray(hidden[4:].view(np.uint16).transpose(1, 0, 2)).tobytes()
    )


def test_run_dtype_accepts_bfloat16():
    from hallulog.cli.app import _CHOICES, build_parser
    from hallulog.config.run_config import ConfigError, LoggingProfile, RunConfig

    assert _CHOICES["dtype"] == ["float16", "float32", "bfloat16"]
    cfg = RunConfig(dtype="bfloat16")
    assert cfg.profile.dtype == "bfloat16" and cfg.fingerprint_fields()["dtype"] == "bfloat16"
    assert build_parser().parse_args(["run", "--dtype", "bfloat16"]).dtype == "bfloat16"
    with pytest.raises(ConfigError, match="--dtype"):
        LoggingProfile("x", "all", "all", "bf16")

"""Capture files that hold only some positions (``row0`` in their metadata,
contracts/capture_rows.py): read in absolute positions, checked against the generation's token
ids, and every sequence mode and position name resolves the same rows from them as from a
capture of every position."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hallulog.contracts.capture_rows import capture_span, prefill_start, rows_to_ask
from hallulog.contracts.positions import POSITION_NAMES
from hallulog.workers.capture import (
    CaptureError,
    CaptureFile,
    load_capture,
    open_capture,
    select_rows,
)
from hallulog.workers.positions import select_positions
from safetensors.numpy import save_file

L, H = 2, 3


def _rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, L, H)).astype(np.float32)


def _write(path, hidden, ids, row0=None) -> str:
    meta = None if row0 is None else {"row0": str(row0)}
    save_file({"hidden_states": hidden, "token_ids": np.asarray(ids, np.int64)}, str(path), meta)
    return str(path)


def test_a_file_without_row0_starts_at_position_0(tmp_path):
    whole, ids = _rows(6), list(range(10, 16))
    with open_capture(_write(tmp_path / "a", whole, ids), ids) as capture:
        assert (capture.row0, capture.num_rows, capture.shape) == (0, 6, (6, L, H))
        np.testing.assert_array_equal(capture[1:4], whole[1:4])


def test_a_narrowed_file_is_read_in_absolute_positions(tmp_path):
    whole, ids = _rows(9), list(range(10, 19))
    path = _write(tmp_path / "b.safetensors", whole[5:], ids[5:], row0=5)
    with open_capture(path, ids, delete=False) as capture:
        assert (capture.row0, capture.num_rows, capture.shape) == (5, 4, (9, L, H))
        np.testing.assert_array_equal(capture[5:9], whole[5:9])
        np.testing.assert_array_equal(capture[7:], whole[7:])
        np.testing.assert_array_equal(capture[np.array([5, 7, 8])], whole[[5, 7, 8]])
        for key in (slice(4, 6), slice(0, 9), np.array([2, 6])):
            with pytest.raises(
                CaptureError, match=r"b\.safetensors: positions .* the file holds 5\.\.8"
            ):
                capture[key]
    np.testing.assert_array_equal(load_capture(path, ids), whole[5:])  # the rows it holds


def test_a_file_ending_early_holds_no_later_row(tmp_path):
    whole, ids = _rows(9), list(range(10, 19))
    with open_capture(_write(tmp_path / "c", whole[:4], ids[:4], row0=0), ids) as capture:
        assert capture.shape[0] == 9
        np.testing.assert_array_equal(capture[0:4], whole[:4])
        with pytest.raises(CaptureError, match="the file holds 0..3"):
            capture[3:5]


@pytest.mark.parametrize(
    ("row0", "file_ids"),
    [
        (4, [14, 15, 16]),  # the ids of positions 4..6: agrees
        (5, [14, 15, 16]),  # row0 one position late for its ids
        (0, [14, 15, 16]),  # no row0 for a narrowed file (a server that forgot it)
        (7, [17, 18, 19]),  # past the generation's end
    ],
)
def test_row0_and_token_ids_must_agree(tmp_path, row0, file_ids):
    ids = list(range(10, 19))
    path = _write(tmp_path / "d.safetensors", _rows(3), file_ids, row0=row0)
    if ids[row0 : row0 + 3] == file_ids:
        open_capture(path, ids).close()
        return
    with pytest.raises(CaptureError, match=r"d\.safetensors: captured token ids differ"):
        open_capture(path, ids)


@pytest.mark.parametrize("bad", ["-1", "x", "1.5", ""])
def test_a_bad_row0_is_refused(tmp_path, bad):
    path = _write(tmp_path / "e.safetensors", _rows(2), [1, 2])
    save_file({"hidden_states": _rows(2), "token_ids": np.array([1, 2])}, path, {"row0": bad})
    with pytest.raises(CaptureError, match=r"e\.safetensors: unreadable capture file.*row0"):
        CaptureFile(path)


NAMES = [(n,) for n in POSITION_NAMES] + [
    ("first:1",),
    ("first:3",),
    ("last:1",),
    ("last:2",),
    ("last:9",),
    ("tbg", "slt", "exact_answer", "last"),
    ("prompt", "tbg"),
    ("first:2", "last:3", "slt"),
]


@pytest.mark.parametrize("capture_mode", ["generation", "prefill"])
def test_every_position_name_resolves_the_same_rows_from_a_narrowed_file(tmp_path, capture_mode):
    """What the worker asks for (``rows_to_ask``; a prefill-only request: ``prefill_start``),
    as a server writes it (``capture_span``), holds every row each name resolves to."""
    checked = 0
    for p, r, names, span in itertools.product(
        (1, 2, 5), (1, 2, 4), NAMES, (None, (0, 1), (1, 3), (0, 9))
    ):
        n = p + r - 1 if capture_mode == "generation" else p + r
        whole, ids = _rows(n, seed=checked), list(range(100, 100 + n))
        asked = rows_to_ask(sequence_mode="positions", positions=names)
        if capture_mode == "generation":
            start, stop = capture_span(asked, prompt_len=p, num_tokens=n)
        else:  # the prefill request's prompt is every position
            k = prefill_start(asked, prompt_len=p, response_len=r)
            start, stop = capture_span(k or "all", prompt_len=n, num_tokens=n)
        path = _write(tmp_path / f"{checked}", whole[start:stop], ids[start:stop], row0=start)
        kwargs = dict(
            prompt_len=p,
            response_len=r,
            capture_mode=capture_mode,
            names=names,
            exact_answer_span=None if span is None else {"tokens": list(span)},
            layer_index=None,
            dtype="float32",
        )
        want = select_positions(whole, **kwargs)
        with open_capture(path, ids) as capture:
            got = select_positions(capture, **kwargs)
        assert got.resolved == want.resolved and got.row0_position == want.row0_position
        np.testing.assert_array_equal(got.acts, want.acts)
        checked += 1
    assert checked == 3 * 3 * len(NAMES) * 4


@pytest.mark.parametrize("capture_mode", ["generation", "prefill"])
@pytest.mark.parametrize("mode", ["all", "prompt", "response", "last"])
def test_every_sequence_mode_resolves_the_same_rows_from_a_narrowed_file(
    tmp_path, capture_mode, mode
):
    for p, r in itertools.product((1, 2, 5), (1, 2, 4)):
        n = p + r - 1 if capture_mode == "generation" else p + r
        whole, ids = _rows(n), list(range(100, 100 + n))
        asked = rows_to_ask(sequence_mode=mode, positions=None)
        assert asked == mode
        if capture_mode == "generation":
            start, stop = capture_span(asked, prompt_len=p, num_tokens=n)
        else:
            k = prefill_start(asked, prompt_len=p, response_len=r)
            start, stop = capture_span(k, prompt_len=n, num_tokens=n)
        path = _write(tmp_path / f"{p}-{r}", whole[start:stop], ids[start:stop], row0=start)
        kwargs = dict(prompt_len=p, response_len=r, sequence_mode=mode, layer_index=None)
        want = select_rows(whole, dtype="float32", **kwargs)
        with open_capture(path, ids) as capture:
            got = select_rows(capture, dtype="float32", **kwargs)
        assert (got.row0_position, got.prompt_rows, got.response_rows) == (
            want.row0_position,
            want.prompt_rows,
            want.response_rows,
        )
        np.testing.assert_array_equal(got.acts, want.acts)

"""The capture-rows selection (contracts/capture_rows.py): what a server writes for each value,
and what a worker asks for."""

from __future__ import annotations

import pytest
from hallulog.contracts.capture_rows import (
    capture_span,
    capture_window,
    check_capture_rows,
    prefill_start,
    row0_metadata,
    rows_to_ask,
)

P, N = 7, 11  # prompt tokens, positions captured (generation capture of 5 response tokens)


@pytest.mark.parametrize(
    ("value", "span"),
    [
        (None, (0, 11)),
        ("all", (0, 11)),
        ("prompt", (0, 7)),
        ("response", (6, 11)),
        ("last", (10, 11)),
        (0, (0, 11)),
        (8, (8, 11)),
        (10, (10, 11)),
        (99, (10, 11)),  # past the end: the last position
    ],
)
def test_capture_span(value, span):
    assert capture_span(value, prompt_len=P, num_tokens=N) == span


def test_a_one_token_prompt_and_a_one_position_capture():
    assert capture_span("response", prompt_len=1, num_tokens=1) == (0, 1)
    assert capture_span("last", prompt_len=1, num_tokens=1) == (0, 1)
    assert capture_span("prompt", prompt_len=3, num_tokens=3) == (0, 3)


def test_capture_window_before_the_length_is_known():
    assert capture_window("response", P) == (6, None)
    assert capture_window("prompt", P) == (0, 7)
    assert capture_window(4, P) == (4, None)
    assert capture_window("last", P)[0] > 10**12


@pytest.mark.parametrize("bad", ["ALL", "tbg", -1, 1.0, True, [1], {"from": 3}])
def test_a_bad_value_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match="hallulog_capture_rows"):
        check_capture_rows(bad)


def test_row0_metadata():
    assert row0_metadata(None) == 0
    assert row0_metadata({"format": "pt"}) == 0
    assert row0_metadata({"row0": "52"}) == 52
    for bad in ("-1", "x", " 3"):
        with pytest.raises(ValueError, match="row0"):
            row0_metadata({"row0": bad})


@pytest.mark.parametrize(
    ("sequence_mode", "positions", "asked"),
    [
        ("all", None, "all"),
        ("prompt", None, "prompt"),
        ("response", None, "response"),
        ("last", None, "last"),
        ("positions", ("tbg", "slt", "exact_answer", "last"), "response"),
        ("positions", ("last",), "last"),
        ("positions", ("last:1",), "last"),
        ("positions", ("tbg",), "response"),
        ("positions", ("response", "first:8"), "response"),
        ("positions", ("prompt",), "prompt"),
        ("positions", ("prompt", "tbg"), "prompt"),
        ("positions", ("last:2",), "all"),  # reaches into the prompt when R < 2
        ("positions", ("prompt", "slt"), "all"),
        ("positions", ("all",), "all"),
    ],
)
def test_rows_to_ask(sequence_mode, positions, asked):
    assert rows_to_ask(sequence_mode=sequence_mode, positions=positions) == asked


def test_prefill_start():
    assert prefill_start("all", prompt_len=7, response_len=5) == 0
    assert prefill_start("prompt", prompt_len=7, response_len=5) == 0
    assert prefill_start("response", prompt_len=7, response_len=5) == 6
    assert prefill_start("last", prompt_len=7, response_len=5) == 11


def test_docs_name_the_field_and_every_value():
    """docs/contracts.md's table of values is the code's (a drift test)."""
    from pathlib import Path

    from hallulog.contracts.capture_rows import CAPTURE_ROWS, CAPTURE_ROWS_FIELD, ROW0_KEY

    doc = (Path(__file__).resolve().parents[2] / "docs" / "contracts.md").read_text()
    section = doc.split("## Capture file", 1)[1].split("\n## ", 1)[0]
    assert f"`{CAPTURE_ROWS_FIELD}`" in section and f"`{ROW0_KEY}`" in section
    table = {line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| `")}
    assert {f'`"{v}"`' for v in CAPTURE_ROWS} <= {t.split(" ")[0] for t in table}

"""The vLLM plugin's copy of the capture-rows rule (hallulog_vllm/capture_rows.py, which may not
import hallulog) agrees with contracts/capture_rows.py. Needs no vLLM."""

from __future__ import annotations

import itertools

import pytest
from hallulog.contracts import capture_rows as contract

from hallulog_vllm import capture_rows as plugin


def test_the_plugin_writes_the_positions_the_contract_says():
    values = [None, *contract.CAPTURE_ROWS, 0, 1, 5, 12, 40]
    for value, p, n in itertools.product(values, range(1, 9), range(1, 14)):
        if n < p:
            continue
        assert plugin.capture_span(value, p, n) == contract.capture_span(
            value, prompt_len=p, num_tokens=n
        ), (value, p, n)
    assert plugin.CAPTURE_ROWS_FIELD == contract.CAPTURE_ROWS_FIELD
    assert plugin.ROW0_KEY == contract.ROW0_KEY


@pytest.mark.parametrize("bad", ["ALL", -1, 1.5, True, [3]])
def test_an_unknown_value_is_none(bad):
    assert plugin.capture_span(bad, 4, 9) is None


@pytest.mark.parametrize(
    ("start", "stop", "size", "want"),
    [
        (0, 9, 4, (0, 3, 0)),
        (5, 9, 4, (1, 3, 4)),
        (8, 9, 4, (2, 3, 8)),
        (3, 4, 16, (0, 1, 0)),
        (16, 40, 16, (1, 3, 16)),
    ],
)
def test_block_span(start, stop, size, want):
    assert plugin.block_span(start, stop, size) == want

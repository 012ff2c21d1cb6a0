"""The capture dtype request field (contracts/capture_dtype.py)."""

from __future__ import annotations

import pytest
from hallulog.contracts.capture_dtype import CAPTURE_DTYPES, check_capture_dtype


@pytest.mark.parametrize("value", [None, *CAPTURE_DTYPES])
def test_the_stored_dtypes_and_none_are_accepted(value):
    assert check_capture_dtype(value) == value


@pytest.mark.parametrize("value", ["int8", "fp16", 16, ""])
def test_anything_else_is_refused_naming_the_field(value):
    with pytest.raises(ValueError, match="hallulog_capture_dtype"):
        check_capture_dtype(value)

"""contracts/jsonl.py's readers for validators and re-reads: scan_lines, is_malformed,
read_row_at, read_document."""

from __future__ import annotations

import pytest
from hallulog.contracts.errors import ArtifactError, MalformedLineError
from hallulog.contracts.jsonl import (
    is_malformed,
    iter_lines,
    read_document,
    read_row_at,
    scan_lines,
)


def test_scan_lines_reports_every_line_it_cannot_take(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"a":1}\n\n[1,2]\nnot json\n{"b":')
    assert list(scan_lines(path)) == [
        (1, {"a": 1}, None),
        (3, [1, 2], None),
        (4, None, "malformed JSON line (Expecting value)"),
        (5, None, "torn JSON line (Expecting value)"),
    ]
    path.write_bytes(b'{"a":1}\n{"b":2}')  # a torn line that parses whole is a row
    assert [v for _, v, _ in scan_lines(path)] == [{"a": 1}, {"b": 2}]
    assert list(scan_lines(tmp_path / "missing.jsonl")) == []


def test_is_malformed_matches_what_iter_lines_refuses(tmp_path):
    lines = [b'{"a":1}\n', b"\n", b"[1]\n", b"nope\n", b'{"torn":']
    assert [is_malformed(raw) for raw in lines] == [False, False, True, True, False]
    path = tmp_path / "x.jsonl"
    path.write_bytes(b"".join(lines))
    with pytest.raises(MalformedLineError, match=r"x\.jsonl:3: not a JSON object") as err:
        list(iter_lines(path))
    assert isinstance(err.value, ValueError) and err.value.line == 3


def test_read_row_at_rereads_one_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"a":1}\n{"b":2}\n')
    starts = {line.row.popitem()[0]: line.start for line in iter_lines(path)}
    with open(path, "rb") as f:
        assert read_row_at(f, starts["b"]) == {"b": 2}
        assert read_row_at(f, starts["a"]) == {"a": 1}


def test_read_document(tmp_path):
    path = tmp_path / "doc.json"
    assert read_document(path) is None
    path.write_text('{"completed": ["a"]}')
    assert read_document(path) == {"completed": ["a"]}
    path.write_text('{\n"x": }')
    with pytest.raises(ArtifactError, match=r"doc\.json:2: malformed checkpoint"):
        read_document(path, "checkpoint")
    path.write_bytes(b'{"x": "\xff"}')
    with pytest.raises(ArtifactError, match="not UTF-8"):
        read_document(path)

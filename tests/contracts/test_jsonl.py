"""hallulog.contracts.jsonl on real files: the committed-tail rule, errors naming file and line,
rollback by truncation, appends that start a fresh line."""

from __future__ import annotations

import json

import pytest
from hallulog.contracts.jsonl import (
    JsonlAppender,
    MalformedLineError,
    committed_size,
    cut_torn_tail,
    encode_line,
    iter_lines,
    iter_rows,
    truncate_to,
)


def test_reads_committed_lines_with_positions(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"a":1}\n\n{"a":2}\n{"a":')
    lines = list(iter_lines(path))
    assert [line.row for line in lines] == [{"a": 1}, {"a": 2}]
    assert [line.lineno for line in lines] == [1, 3]
    assert (lines[1].start, lines[1].end) == (9, 17)
    assert committed_size(path) == 17


def test_missing_file_is_empty(tmp_path):
    assert list(iter_rows(tmp_path / "nope.jsonl")) == []
    assert committed_size(tmp_path / "nope.jsonl") == 0


@pytest.mark.parametrize("bad", [b"not json", b"[1, 2]", b"\xff\xfe"])
def test_malformed_middle_line_names_file_and_line(tmp_path, bad):
    path = tmp_path / "w.jsonl"
    path.write_bytes(b'{"a":1}\n' + bad + b'\n{"a":3}\n')
    with pytest.raises(MalformedLineError, match=r"w\.jsonl:2: ") as info:
        list(iter_rows(path))
    assert info.value.line == 2
    seen = []
    rows = list(iter_lines(path, malformed="skip", on_malformed=lambda n, m: seen.append(n)))
    assert [r.row["a"] for r in rows] == [1, 3] and seen == [2]
    assert path.read_bytes().count(b"\n") == 3  # nothing rewritten


def test_committed_size_scans_back_across_blocks(tmp_path):
    path = tmp_path / "big.jsonl"
    head = b"".join(json.dumps({"i": i}).encode() + b"\n" for i in range(5000))
    path.write_bytes(head + b"x" * 200_000)  # a torn tail longer than a block
    assert committed_size(path) == len(head)
    assert cut_torn_tail(path) == 200_000
    assert path.read_bytes() == head


def test_appender_cuts_a_torn_tail_then_appends_and_rolls_back(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_bytes(b'{"a":1}\n{"a":')
    with JsonlAppender(path) as out:
        mark = out.tell()
        assert mark == 8
        out.append([{"a": 2}, {"a": 3}])
        out.sync()
        assert [r["a"] for r in iter_rows(path)] == [1, 2, 3]
        out.rollback(mark)
        out.append([{"a": 4}])
    assert [r["a"] for r in iter_rows(path)] == [1, 4]


def test_truncate_refuses_to_grow(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"a":1}\n')
    with pytest.raises(ValueError, match="cannot truncate"):
        truncate_to(path, 100)
    assert truncate_to(path, 0) == 8 and path.read_bytes() == b""


@pytest.mark.parametrize(
    "row",
    [
        {"a": 1, "b": [1.5, None, True], "c": {"d": "x"}},
        {"text": "a, b: c", "nl": "line\nnext\ttab"},
        {"q": 'say "hi", then: go', "k": "x"},
        {"bs": "ends with a backslash\\", "after": ", :"},
        {"mix": 'a\\"b', "u": "é ü \u2028 \x01"},
        {'key "quoted"': ['"', "\\", '\\"', ":", ","]},
    ],
)
def test_encode_line_matches_the_stdlibs_compact_form(row):
    compact = json.dumps(row, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
    assert encode_line(row) == compact

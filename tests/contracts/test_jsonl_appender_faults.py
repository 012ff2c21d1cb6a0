"""JsonlAppender under failing writes: a failed sync leaves nothing a later sync would glue to the
next rows, and rollback drops buffered and written rows alike."""

from __future__ import annotations

import pytest
from hallulog.contracts.jsonl import JsonlAppender, iter_rows
from hallulog.workers._faults import inject


@pytest.mark.parametrize("op", ["write", "fsync"])
def test_failed_sync_is_cut_back_and_the_next_rows_stay_whole(tmp_path, op):
    path = tmp_path / "g.jsonl"
    with JsonlAppender(path) as f:
        f.append([{"a": 1}])
        f.sync()
        f.append([{"b": 2}, {"c": 3}])
        with inject(op, nth=1, err="EIO"), pytest.raises(OSError):
            f.sync()
        assert f.tell() == path.stat().st_size  # cut back to the last good row
        f.append([{"d": 4}])
        f.sync()
    assert list(iter_rows(path)) == [{"a": 1}, {"d": 4}]


def test_rollback_drops_buffered_and_written_rows(tmp_path):
    path = tmp_path / "g.jsonl"
    f = JsonlAppender(path)
    f.append([{"a": 1}])
    f.sync()
    mark = f.tell()
    f.append([{"b": 2}])
    f.sync()
    f.append([{"c": 3}])  # buffered only
    f.rollback(mark)
    f.append([{"d": 4}])
    f.close()
    assert list(iter_rows(path)) == [{"a": 1}, {"d": 4}]

"""The append-only commit log shared by the packed and zarr writers (one JSON line a sample)."""

from __future__ import annotations

import json
import os

from ._io import write_all
from .errors import StorageError

__all__ = ["append_records", "record_line", "tail_to_drop"]


def record_line(record: dict) -> bytes:
    return (json.dumps(record, sort_keys=True) + "\n").encode()


def append_records(fd: int, lines: list[bytes]) -> list[int]:
    """Append ``lines`` with one write and one fdatasync; return the byte offset of each line.

    One write keeps a group's lines together: after a crash the log ends at a line boundary or
    in a torn last line (no newline), which recovery cuts off.
    """
    start = os.lseek(fd, 0, os.SEEK_END)
    starts = []
    pos = start
    for line in lines:
        starts.append(pos)
        pos += len(line)
    write_all(fd, b"".join(lines))
    os.fdatasync(fd)
    return starts


def tail_to_drop(records: list[dict], keep: set[str], fmt: str, path: str) -> int | None:
    """Index of the first record not in ``keep`` (None: nothing to drop).

    Stores are append-only, so a rollback may drop only a tail; a kept record after a dropped
    one is an error.
    """
    drop_at = next((j for j, r in enumerate(records) if r["key"] not in keep), None)
    if drop_at is None:
        return None
    kept_later = [r["key"] for r in records[drop_at:] if r["key"] in keep]
    if kept_later:
        raise StorageError(f"{fmt} rollback drops only a tail: {records[drop_at]['key']} is "
                           f"dropped but later samples {kept_later[:3]} are kept", path)
    return drop_at

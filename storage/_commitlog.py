"""The append-only commit log shared by the packed and zarr writers (one JSON line a sample)."""

from __future__ import annotations

import json
import os
from array import array
from typing import Iterator, Sequence

from ._io import write_all
from .errors import StorageError

__all__ = ["append_records", "record_line", "tail_to_drop", "RecordColumns"]


def record_line(record: dict) -> bytes:
    return (json.dumps(record, sort_keys=True) + "\n").encode()


def append_records(fd: int, lines: list[bytes]) -> list[int]:
    """Append ``lines`` with one write and one fdatasync; return the byte offset of each line.

    One write keeps a group's lines together: after a crash the log ends at a line boundary or
    in a torn last line (no newline), which recovery cuts off. On failure the log is cut back
    to where the lines started (best effort) and the error propagates: nothing is committed.
    """
    start = os.lseek(fd, 0, os.SEEK_END)
    starts = []
    pos = start
    for line in lines:
        starts.append(pos)
        pos += len(line)
    try:
        write_all(fd, b"".join(lines))
        os.fdatasync(fd)
    except BaseException:
        # Torn or not-durable lines must not stay: the next group's would be glued to them.
        try:
            os.ftruncate(fd, start)
        except OSError:
            pass  # reopening the store drops a torn last line; whole ones are rolled back
        raise
    return starts


def tail_to_drop(keys: Sequence[str], keep: set[str], fmt: str, path: str) -> int | None:
    """Index of the first committed key not in ``keep`` (None: nothing to drop).

    Stores are append-only, so a rollback may drop only a tail; a kept record after a dropped
    one is an error.
    """
    drop_at = next((j for j, k in enumerate(keys) if k not in keep), None)
    if drop_at is None:
        return None
    kept_later = [k for k in keys[drop_at:] if k in keep]
    if kept_later:
        raise StorageError(f"{fmt} rollback drops only a tail: {keys[drop_at]} is "
                           f"dropped but later samples {kept_later[:3]} are kept", path)
    return drop_at


class RecordColumns:
    """A writer's committed records as columns: the keys in a list, every other (integer) field
    in an ``array('q')``. A record costs ~100 bytes here where a dict costs ~1 KB, and a writer
    holds one per committed sample for the whole run (and reloads them on resume)."""

    def __init__(self, fields: Sequence[str]) -> None:
        assert fields[0] == "key", fields
        self.keys: list[str] = []
        self.columns = {name: array("q") for name in fields[1:]}

    def append(self, record: dict) -> None:
        self.keys.append(record["key"])
        for name, column in self.columns.items():
            column.append(int(record[name]))

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> dict:
        return {"key": self.keys[i], **{n: c[i] for n, c in self.columns.items()}}

    def __iter__(self) -> Iterator[dict]:
        return (self[i] for i in range(len(self.keys)))

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` records."""
        del self.keys[n:]
        for column in self.columns.values():
            del column[n:]

"""The append-only commit log shared by the packed and zarr writers (one JSON line a sample)."""

from __future__ import annotations

import json
import os

from ._io import write_all
from .errors import StorageError

__all__ = ["append_record", "tail_to_drop"]


def append_record(fd: int, record: dict) -> int:
    """Append one record durably (fdatasync); return the byte offset where its line starts.

    On failure the log is cut back to where the line started (best effort) and the error
    propagates: the sample is not committed.
    """
    start = os.lseek(fd, 0, os.SEEK_END)
    try:
        write_all(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
        os.fdatasync(fd)
    except BaseException:
        # A torn or not-durable line must not stay: the next record would be glued to it.
        try:
            os.ftruncate(fd, start)
        except OSError:
            pass  # reopening the store drops a torn last line; a whole one is rolled back
        raise
    return start


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

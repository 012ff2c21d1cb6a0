"""The append-only commit log shared by the packed and zarr writers (one JSON line a sample):
appending a group's records (:class:`CommitLogWriter`), reading them back on reopen
(:func:`read_commit_log`, :func:`cut_uncommitted`) and dropping a tail on rollback."""

from __future__ import annotations

import json
import logging
import os
from array import array
from collections.abc import Iterator, Sequence

from hallulog.contracts.errors import MalformedLineError
from hallulog.contracts.jsonl import committed_size, iter_lines
from hallulog.storage._io import write_all
from hallulog.storage.errors import ManifestError, StorageError

__all__ = [
    "COMMIT_LOG",
    "record_line_bytes",
    "append_records",
    "record_line",
    "tail_to_drop",
    "read_commit_log",
    "cut_uncommitted",
    "CommitLogWriter",
    "RecordColumns",
]

log = logging.getLogger(__name__)

COMMIT_LOG = "commit.log"
"""The commit log's name in its store's directory (packed and zarr)."""


def record_line(record: dict) -> bytes:
    return (json.dumps(record, sort_keys=True) + "\n").encode()


def record_line_bytes(key_len: int, rows: float) -> int:
    """Bytes of one sample's commit-log line (a key of ``key_len`` characters, ``rows`` rows,
    offsets and checksums at their widest), for projections."""
    n = max(1, round(rows))
    return len(
        record_line(
            {
                "key": "k" * key_len,
                "shard": 0,
                "offset": 10**9,
                "seq_len": n,
                "prompt_len": 1,
                "response_len": n,
                "label": 0,
                "crc32": 10**9,
            }
        )
    )


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


def read_commit_log(log_path: str) -> Iterator[tuple[int, int, dict]]:
    """``(line number, byte offset, record)`` of every committed line (a torn last line, the
    record a crash cut short, is not read); a malformed line is a :class:`ManifestError`."""
    try:
        for line in iter_lines(log_path):
            yield line.lineno, line.start, line.row
    except MalformedLineError as exc:
        raise ManifestError("unparsable commit log line", log_path, line=exc.line) from None


def cut_uncommitted(log_path: str) -> int:
    """Cut a torn last record off the log; returns the committed size (bytes kept)."""
    end, size = committed_size(log_path), os.path.getsize(log_path)
    if end != size:
        log.warning("%s: dropping %d bytes of an uncommitted record", log_path, size - end)
        os.truncate(log_path, end)
    return end


class CommitLogWriter:
    """The commit point of a writer with a commit log (packed, zarr), once its samples' bytes
    are durable. The writer holds ``_log_fd``, ``_pending`` (``[(key, record)]``), ``_records``,
    ``_keys``, ``_line_starts`` and ``_staged``."""

    _log_fd: int
    _pending: list[tuple[str, dict]]
    _staged: list[bytes]

    def _append_pending(self) -> None:
        """Append the pending records to the log (one write, one fdatasync), then count them
        committed. Pending stays pending until its log lines are durable: a failed append
        leaves the group for ``rollback()`` to drop (:func:`append_records` cuts its own torn
        lines)."""
        self._staged = []
        for key, rec in self._pending:
            self._commit(key, rec)
        self._line_starts.extend(append_records(self._log_fd, self._staged))  # type: ignore[attr-defined]
        self._staged = []
        pending, self._pending = self._pending, []
        for key, rec in pending:
            self._records.append(rec)  # type: ignore[attr-defined]
            self._keys.add(key)  # type: ignore[attr-defined]

    def _commit(self, key: str, record: dict) -> None:
        """Stage the record's log line (tests interpose here to crash mid-commit)."""
        self._staged.append(record_line(record))


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
        raise StorageError(
            f"{fmt} rollback drops only a tail: {keys[drop_at]} is "
            f"dropped but later samples {kept_later[:3]} are kept",
            path,
        )
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

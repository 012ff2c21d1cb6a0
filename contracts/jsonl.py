"""Streaming JSONL: the one way hallulog reads and writes its line-oriented files.

The committed-tail rule: a line counts once its terminating newline is on disk. A last line
without one is a torn tail (a crash mid-append): readers stop before it, and a writer that
reopens the file cuts it off first (:func:`cut_torn_tail`). A complete line that is not a JSON
object is an error naming the file and line (``malformed="raise"``), or is reported and skipped
(``"skip"``: validators and repair tools). Readers hold one line at a time; rollback truncates to
a byte offset (:func:`truncate_to`) instead of rewriting the file.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import orjson
from hallulog.contracts.errors import ArtifactError, MalformedLineError

__all__ = [
    "Line",
    "iter_lines",
    "iter_rows",
    "scan_lines",
    "read_row_at",
    "read_document",
    "is_malformed",
    "committed_size",
    "cut_torn_tail",
    "truncate_to",
    "dumps",
    "encode",
    "encode_line",
    "parse_line",
    "JsonlAppender",
    "MalformedLineError",
]

log = logging.getLogger(__name__)

_BLOCK = 1 << 16


@dataclass(frozen=True, slots=True)
class Line:
    """One committed line: its 1-based number, byte span ``[start, end)``, parsed row and
    bytes (newline included)."""

    lineno: int
    start: int
    end: int
    row: dict[str, Any]
    raw: bytes = b""


def iter_lines(
    path: str | Path,
    *,
    malformed: Literal["raise", "skip"] = "raise",
    on_malformed: Callable[[int, str], None] | None = None,
) -> Iterator[Line]:
    """Committed lines of ``path`` (none when it does not exist), streamed.

    ``malformed="raise"`` raises :class:`MalformedLineError` at the first complete line that is
    not a JSON object; ``"skip"`` logs it (and calls ``on_malformed(lineno, message)``) and goes
    on. Blank lines are skipped. The torn tail is never yielded.
    """
    path = Path(path)
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return
    with f:
        offset = 0
        for lineno, raw in enumerate(f, start=1):
            start, offset = offset, offset + len(raw)
            if not raw.endswith(b"\n"):
                return  # torn tail
            if raw.isspace():
                continue
            try:
                row = parse_line(raw)
                problem = None if isinstance(row, dict) else "not a JSON object"
            except (ValueError, UnicodeDecodeError) as exc:
                problem = f"malformed JSON ({getattr(exc, 'msg', exc)})"
            if problem is None:
                yield Line(lineno, start, offset, row, raw)
                continue
            if malformed == "raise":
                raise MalformedLineError(str(path), lineno, problem)
            log.warning("%s:%d: %s; line skipped", path, lineno, problem)
            if on_malformed is not None:
                on_malformed(lineno, problem)


def scan_lines(path: str | Path) -> Iterator[tuple[int, Any, str | None]]:
    """``(lineno, value, problem)`` for every non-blank line of ``path``, the last one too when
    it is torn: for validators, which report every line they cannot take.

    ``value`` is whatever JSON the line holds (not only objects; None when it does not parse);
    ``problem`` is None, or ``"torn JSON line (...)"`` / ``"malformed JSON line (...)"``. A torn
    last line that parses whole is yielded as a value (only its newline is missing).
    """
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return
    with f:
        for lineno, raw in enumerate(f, start=1):
            if raw.isspace():
                continue
            try:
                yield lineno, parse_line(raw), None
            except (ValueError, UnicodeDecodeError) as exc:
                what = "torn" if not raw.endswith(b"\n") else "malformed"
                yield lineno, None, f"{what} JSON line ({getattr(exc, 'msg', exc)})"


def read_row_at(f: BinaryIO, offset: int) -> Any:
    """The JSON value of the line that starts at byte ``offset`` of the binary file ``f`` (an
    offset :func:`iter_lines` gave as ``Line.start``): one line re-read on demand."""
    f.seek(offset)
    return parse_line(f.readline())


def is_malformed(raw: bytes) -> bool:
    """A complete line that is not a JSON object: one :func:`iter_lines` refuses (a blank line
    or a torn tail is not malformed: the tail is the recovery's business)."""
    if not raw.endswith(b"\n") or raw.isspace():
        return False
    try:
        return not isinstance(parse_line(raw), dict)
    except (ValueError, UnicodeDecodeError):
        return True


def read_document(path: str | Path, what: str = "JSON document") -> Any:
    """The one JSON value a whole file holds (a manifest, a checkpoint); None when the file does
    not exist. Malformed JSON or bytes that are not UTF-8 are an
    :class:`~hallulog.contracts.errors.ArtifactError` naming the file (and line), e.g.
    ``run_manifest.json:3: malformed manifest (Expecting value)`` for ``what="manifest"``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise ArtifactError(f"{path}: not UTF-8 (byte offset {exc.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{path}:{exc.lineno}: malformed {what} ({exc.msg})") from None


def parse_line(raw: bytes) -> Any:
    """One JSON value: orjson (3-4x the stdlib), the stdlib where orjson refuses (NaN or
    Infinity as Python writes them, ints beyond 64 bits) or the line is malformed (so errors
    read as the stdlib's)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def iter_rows(
    path: str | Path, *, malformed: Literal["raise", "skip"] = "raise"
) -> Iterator[dict[str, Any]]:
    """The rows of :func:`iter_lines`, without positions."""
    for line in iter_lines(path, malformed=malformed):
        yield line.row


def committed_size(path: str | Path) -> int:
    """Byte length of the committed lines: the offset just past the last newline.

    Reads backwards from the end in blocks, so its cost is the torn tail's size, not the file's.
    """
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return 0
    with f:
        end = f.seek(0, os.SEEK_END)
        pos = end
        while pos > 0:
            step = min(_BLOCK, pos)
            pos -= step
            f.seek(pos)
            block = f.read(step)
            nl = block.rfind(b"\n")
            if nl >= 0:
                return pos + nl + 1
        return 0


def truncate_to(path: str | Path, offset: int) -> int:
    """Cut ``path`` to ``offset`` bytes (durably); returns the number of bytes removed."""
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        if offset > size:
            raise ValueError(f"{path}: cannot truncate to {offset} bytes, it has {size}")
        if offset < size:
            f.truncate(offset)
            f.flush()
            os.fsync(f.fileno())
        return size - offset


def cut_torn_tail(path: str | Path) -> int:
    """Remove a torn last line (no newline) so that the next append starts a fresh line."""
    path = Path(path)
    if not path.exists():
        return 0
    cut = truncate_to(path, committed_size(path))
    if cut:
        log.warning("%s: cut a torn last line (%d bytes)", path, cut)
    return cut


def dumps(row: dict[str, Any]) -> str:
    """One compact JSON line, newline included."""
    return encode_line(row).decode("utf-8")


def encode_line(row: dict[str, Any]) -> bytes:
    """One compact JSON line as UTF-8 bytes, newline included.

    orjson (about 10x the stdlib on worker rows): compact separators, non-ASCII kept, the
    shortest float repr, and a non-finite float written as ``null`` (JSON has no NaN or
    Infinity). What orjson cannot encode (a non-``str`` key, an int beyond 64 bits) goes
    through the stdlib with the same separators.
    """
    try:
        return orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE)
    except (orjson.JSONEncodeError, TypeError):
        return (json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def encode(rows: Iterable[dict[str, Any]]) -> bytes:
    """Rows as the bytes of :func:`dumps` lines (for :meth:`JsonlAppender.append_encoded`)."""
    return b"".join(encode_line(r) for r in rows)


class JsonlAppender:
    """Appends rows to one JSONL file; :meth:`sync` makes them durable (one fsync).

    Opening cuts a torn tail first (the committed-tail rule), so appends always start a line.
    Rows are buffered here (not in a stdio buffer) and written with ``os.write``, so a failed
    write or fsync never leaves bytes behind that a later flush would glue to the next group's
    rows: a failed :meth:`sync` cuts the file back to where it started and raises, and
    :meth:`rollback` drops what is buffered as well as what is on disk.
    """

    _SPILL = 1 << 20  # write (without fsync) once this much is buffered

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        cut_torn_tail(self.path)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size
        self._pending = bytearray()
        self._dirty = False

    def tell(self) -> int:
        """The byte offset the next row will start at (a rollback point)."""
        return self._size + len(self._pending)

    def append(self, rows: Iterable[dict[str, Any]]) -> int:
        """Buffer rows (not yet durable); returns how many."""
        return self.append_encoded(encode(rows))

    def append_encoded(self, data: bytes) -> int:
        """Buffer lines :func:`encode` made (not yet durable); returns how many."""
        if data:
            self._pending += data
            self._dirty = True
            if len(self._pending) >= self._SPILL:
                self._write_pending()
        return data.count(b"\n")

    def _write_pending(self) -> None:
        assert self._fd is not None, f"{self.path}: appender is closed"
        start = self._size
        try:
            data, done = bytes(self._pending), 0
            while done < len(data):
                done += os.write(self._fd, data[done:])
        except BaseException:
            self._cut(start)
            raise
        self._size += len(self._pending)
        self._pending.clear()

    def sync(self) -> None:
        """Write and fsync what was appended since the last sync.

        On failure the file is cut back to its length before this call's writes, the rows are
        dropped, and the error propagates (the caller rolls its group back).
        """
        if not self._dirty:
            return
        start = self._size
        self._write_pending()
        try:
            os.fsync(self._fd)
        except BaseException:
            self._cut(start)
            raise
        self._dirty = False

    def _cut(self, offset: int) -> None:
        """Best effort after a failed write: drop buffered rows, truncate to ``offset``."""
        self._pending.clear()
        self._dirty = False
        try:
            os.ftruncate(self._fd, offset)
            self._size = offset
        except OSError:  # the caller's rollback (or the next run's recovery) cuts it
            self._size = os.fstat(self._fd).st_size

    def rollback(self, offset: int) -> None:
        """Drop everything from ``offset`` on (the rows of a group that failed to commit)."""
        if offset >= self._size:
            del self._pending[offset - self._size :]
            self._dirty = bool(self._pending)
            return
        self._pending.clear()
        self._dirty = False
        size = os.fstat(self._fd).st_size
        if offset > size:
            raise ValueError(f"{self.path}: cannot truncate to {offset} bytes, it has {size}")
        os.ftruncate(self._fd, offset)
        os.fsync(self._fd)
        self._size = offset

    def close(self) -> None:
        if self._fd is None:
            return
        try:
            self.sync()
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Shared pieces of the task loaders: result type, errors, line-aware file reading."""

from __future__ import annotations

import codecs
import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hallulog.contracts.errors import HallulogError
from hallulog.contracts.prompt_group import PromptGroup

__all__ = [
    "TaskData",
    "MalformedLine",
    "DatasetFormatError",
    "FileKindError",
    "MalformedCollector",
    "read_text",
    "iter_text_lines",
    "LineCounter",
    "iter_jsonl",
    "skip_ws",
    "GroupCounter",
]

log = logging.getLogger("hallulog.tasks")

# Individual warnings per file before only the summary is logged.
_MAX_WARNINGS_PER_FILE = 20


class DatasetFormatError(HallulogError, ValueError):
    """A dataset file that cannot be used; ``str()`` is ``"<file>:<line>: <what is wrong>"``."""

    def __init__(self, file: str | Path, line: int, what: str) -> None:
        self.file = str(file)
        self.line = int(line)
        self.what = what
        super().__init__(f"{self.file}:{self.line}: {what}")


class FileKindError(DatasetFormatError):
    """A file that is not of a kind its reader reads: bytes that are not UTF-8 text, not
    Parquet, not a ``datasets`` directory, an extension that names no format, or no record in
    the layout expected. A task that knows its layouts adds what it reads and which flags map
    another layout (``tasks.layout_hint``)."""


@dataclass(frozen=True)
class MalformedLine:
    """One skipped record of a line-oriented file (JSONL, CSV)."""

    file: str
    line: int
    """1-based line number where the record starts."""
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


@dataclass(frozen=True)
class TaskData:
    """What a task loader returns."""

    groups: list[PromptGroup]
    source: str
    """Path of the file the groups were read from."""
    prompt_template: str
    """The template text the prompts were built with (hash it for ``prompt_template_hash``)."""
    malformed: list[MalformedLine] = field(default_factory=list)
    """Records skipped because they were malformed (line-oriented files only)."""
    task: str = ""
    split: str = ""

    def __len__(self) -> int:
        return len(self.groups)


class MalformedCollector:
    """Collects skipped records of one file and logs each (up to a cap) with file:line."""

    def __init__(self, file: str, strict: bool, quiet: bool = False) -> None:
        self.file = file
        self.strict = strict
        self.quiet = quiet
        """Collect without logging (a file read again, whose lines were reported already)."""
        self.items: list[MalformedLine] = []

    def add(self, line: int, message: str) -> None:
        if self.strict:
            raise DatasetFormatError(self.file, line, message)
        self.items.append(MalformedLine(self.file, line, message))
        if len(self.items) <= _MAX_WARNINGS_PER_FILE and not self.quiet:
            log.warning("%s:%d: %s; line skipped", self.file, line, message)

    def finish(self) -> list[MalformedLine]:
        if self.quiet:
            pass
        elif len(self.items) > _MAX_WARNINGS_PER_FILE:
            log.warning(
                "%s: %d malformed lines skipped in all (only the first %d were logged)",
                self.file,
                len(self.items),
                _MAX_WARNINGS_PER_FILE,
            )
        elif self.items:
            log.warning("%s: %d malformed line(s) skipped", self.file, len(self.items))
        return list(self.items)


def read_text(path: str | Path) -> str:
    """The file as text (UTF-8, optional BOM); undecodable bytes are an error naming the line."""
    raw = Path(path).read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise FileKindError(
            path, line, f"not valid UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None


def iter_text_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """``(line_number, line)`` of a UTF-8 text file (optional BOM), read as a stream.

    Lines are split on ``"\\n"`` only and keep no line end; undecodable bytes are an error
    naming the line.
    """
    offset = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            start = 3 if lineno == 1 and raw.startswith(codecs.BOM_UTF8) else 0
            try:
                line = raw[start:].decode("utf-8")
            except UnicodeDecodeError as exc:
                raise FileKindError(
                    path,
                    lineno,
                    f"not valid UTF-8 ({exc.reason} at byte {offset + start + exc.start})",
                ) from None
            offset += len(raw)
            yield lineno, line.removesuffix("\n")


_WS = re.compile(r"[ \t\n\r]*")


def skip_ws(text: str, pos: int) -> int:
    """Position of the first non-JSON-whitespace character at or after ``pos``."""
    return _WS.match(text, pos).end()  # type: ignore[union-attr]


class LineCounter:
    """1-based line number of a character offset; cheap for increasing offsets."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._pos = 0
        self._line = 1

    def line_at(self, pos: int) -> int:
        if pos < self._pos:
            self._pos, self._line = 0, 1
        self._line += self.text.count("\n", self._pos, pos)
        self._pos = pos
        return self._line


def iter_jsonl(
    path: str | Path, collector: MalformedCollector
) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """Yield ``(line_number, record_index, object)`` for each JSON object line of the file at
    ``path``, read as a stream.

    Blank lines are not records. ``record_index`` counts every non-blank line (malformed ones too,
    so fixing a bad line never renumbers the others), starting at 0. Lines that are not valid JSON
    or not a JSON object go to ``collector``.
    """
    index = -1
    for lineno, line in iter_text_lines(path):
        if not line.strip():
            continue
        index += 1
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            collector.add(lineno, f"invalid JSON: {exc.msg} (column {exc.colno})")
            continue
        if not isinstance(obj, dict):
            collector.add(lineno, f"expected a JSON object, got {type(obj).__name__}")
            continue
        yield lineno, index, obj


class GroupCounter:
    """Counts a loader's groups: duplicate ids are malformed, ``limit`` says when to stop."""

    def __init__(self, collector: MalformedCollector, limit: int | None, what: str) -> None:
        self.collector, self.limit, self.what = collector, limit, what
        self.count = 0
        self._seen: dict[str, int] = {}

    @property
    def full(self) -> bool:
        return self.limit is not None and self.count >= self.limit

    def admit(self, lineno: int, record_id: str) -> bool:
        """Whether the record with this id (first seen on ``lineno``) is new; counts it."""
        first = self._seen.setdefault(record_id, lineno)
        if first != lineno:
            self.collector.add(
                lineno, f"duplicate {self.what} {record_id!r} (first on line {first})"
            )
            return False
        self.count += 1
        return True

    def check_some(self, path: str, what: str) -> None:
        """Raise when the file gave no group (naming the first malformed line, if any)."""
        if self.count:
            return
        if self.collector.items:
            first = self.collector.items[0]
            raise FileKindError(
                path,
                first.line,
                f"no valid {what} in the file "
                f"({len(self.collector.items)} malformed line(s); "
                f"first: {first.message})",
            )
        raise FileKindError(path, 1, f"the file holds no {what}s")

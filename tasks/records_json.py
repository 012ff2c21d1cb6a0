"""JSON documents read item by item: the text is held, every value decoded when reached.

```python
from hallulog.tasks.records_json import JsonDocument
doc = JsonDocument("dev-v2.0.json")   # the whole text in memory (a document, not a stream)
for pos, article in doc.items(doc.locate("data")):
    doc.line_at(pos), doc.find_key(pos, "paragraphs")
```

``json.JSONDecoder.raw_decode`` decodes one value at a given offset, so each item is decoded on
its own (no list of every item is built) and every item and error has a line number.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hallulog.tasks.base import DatasetFormatError, FileKindError, LineCounter, read_text, skip_ws

__all__ = ["JsonDocument", "AFTER_DOCUMENT"]

AFTER_DOCUMENT = (
    "unexpected data after the JSON document (one JSON value per line is JSON Lines: "
    "name the file .jsonl, or give --task-format jsonl)"
)

log = logging.getLogger(__name__)

_DECODER = json.JSONDecoder()


class JsonDocument:
    """A JSON document held as text and walked value by value (``raw_decode``), so every
    position has a line number and no list of all items is ever built."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.text = read_text(path)
        self._lines = LineCounter(self.text)

    def line_at(self, pos: int) -> int:
        return self._lines.line_at(pos)

    def fail(self, pos: int, what: str) -> DatasetFormatError:
        return DatasetFormatError(self.path, self.line_at(min(pos, len(self.text))), what)

    def _expect(self, pos: int, char: str, what: str) -> int:
        if pos >= len(self.text) or self.text[pos] != char:
            got = "end of file" if pos >= len(self.text) else repr(self.text[pos])
            raise self.fail(pos, f"expected {what}, got {got}")
        return pos + 1

    def decode(self, pos: int) -> tuple[Any, int]:
        """The value at ``pos`` and the position after it."""
        try:
            return _DECODER.raw_decode(self.text, pos)
        except json.JSONDecodeError as exc:
            raise DatasetFormatError(
                self.path, exc.lineno, f"invalid JSON: {exc.msg} (column {exc.colno})"
            ) from None

    def items(self, pos: int) -> Iterator[tuple[int, Any]]:
        """``(start, value)`` of each element of the array at ``pos``, decoded one at a time."""
        text = self.text
        pos = skip_ws(text, self._expect(pos, "[", "'['"))
        if pos < len(text) and text[pos] == "]":
            return
        while True:
            start = pos
            value, pos = self.decode(pos)
            yield start, value
            pos = skip_ws(text, pos)
            if pos < len(text) and text[pos] == ",":
                pos = skip_ws(text, pos + 1)
                continue
            self._expect(pos, "]", "',' or ']' in a list")
            return

    def skip(self, pos: int) -> int:
        """The position after the value at ``pos`` (an array is walked element by element)."""
        if pos < len(self.text) and self.text[pos] == "[":
            text, last = self.text, pos
            pos = skip_ws(text, pos + 1)
            if pos < len(text) and text[pos] == "]":
                return pos + 1
            while True:
                _value, last = self.decode(pos)
                pos = skip_ws(text, last)
                if pos < len(text) and text[pos] == ",":
                    pos = skip_ws(text, pos + 1)
                    continue
                return self._expect(pos, "]", "',' or ']' in a list")
        return self.decode(pos)[1]

    def members(self, pos: int) -> tuple[list[tuple[str, int]], int]:
        """``(key, value_start)`` of each member of the object at ``pos`` (values skipped, not
        kept) and the position after the object."""
        text = self.text
        pos = skip_ws(text, self._expect(pos, "{", "'{'"))
        out: list[tuple[str, int]] = []
        if pos < len(text) and text[pos] == "}":
            return out, pos + 1
        while True:
            if pos >= len(text) or text[pos] != '"':
                self._expect(pos, '"', "a quoted key")
            key, pos = self.decode(pos)
            pos = skip_ws(self.text, self._expect(skip_ws(text, pos), ":", "':'"))
            out.append((key, pos))
            pos = skip_ws(text, self.skip(pos))
            if pos < len(text) and text[pos] == ",":
                pos = skip_ws(text, pos + 1)
                continue
            return out, self._expect(pos, "}", "',' or '}' in an object")

    def find_key(self, pos: int, key: str) -> int | None:
        """Start of ``key``'s value in the object at ``pos`` (the last one, as ``json`` does);
        ``None`` when it is absent or the value at ``pos`` is not an object."""
        if pos >= len(self.text) or self.text[pos] != "{":
            return None
        found = [start for k, start in self.members(pos)[0] if k == key]
        return found[-1] if found else None

    def root(self) -> int:
        pos = skip_ws(self.text, 0)
        if pos >= len(self.text):
            raise FileKindError(self.path, 1, "empty file")
        return pos

    def locate(self, records_key: str | None = None) -> int:
        """Start of the list of records (see the module docstring); the whole document is
        checked on the way."""
        root = self.root()
        first = self.text[root]
        if first not in "[{":
            raise FileKindError(
                self.path,
                self.line_at(root),
                "expected a JSON list of records or an object holding one",
            )
        members: list[tuple[str, int]] = []
        if first == "[":
            end = self.skip(root)
        else:
            members, end = self.members(root)
        rest = skip_ws(self.text, end)
        if rest < len(self.text):
            raise FileKindError(self.path, self.line_at(rest), AFTER_DOCUMENT)
        if records_key is None:
            if first == "[":
                return root
            lists = [(k, p) for k, p in members if self.text[p] == "["]
            if len(lists) == 1:
                return lists[0][1]
            if not lists:
                keys = ", ".join(repr(k) for k, _ in members) or "none"
                raise DatasetFormatError(
                    self.path, 1, f"no list of records in the top-level object (keys: {keys})"
                )
            raise DatasetFormatError(
                self.path,
                1,
                "several lists in the top-level object ("
                f"{', '.join(repr(k) for k, _ in lists)}): choose one as "
                "the records key",
            )
        pos, walked = root, []
        for part in records_key.split("."):
            nxt: int | None = None
            if pos == root and first == "{":  # the top level was walked already
                nxt = next((s for k, s in reversed(members) if k == part), None)
            elif self.text[pos] == "{":
                nxt = self.find_key(pos, part)
            elif self.text[pos] == "[" and part.isdigit():
                nxt = next((s for i, (s, _v) in enumerate(self.items(pos)) if i == int(part)), None)
            walked.append(part)
            if nxt is None:
                keys = ""
                if self.text[pos] == "{":
                    keys = " (keys: " + ", ".join(repr(k) for k, _ in self.members(pos)[0]) + ")"
                raise self.fail(
                    pos,
                    f"records key {records_key!r}: no {'.'.join(walked)!r} in the document{keys}",
                )
            pos = nxt
        if self.text[pos] != "[":
            raise self.fail(pos, f"records key {records_key!r} does not hold a list")
        return pos

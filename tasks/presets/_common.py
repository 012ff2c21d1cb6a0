"""Shared pieces of the preset readers: the conversion context and field checks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hallulog.contracts.errors import HallulogError
from hallulog.tasks.base import MalformedCollector
from hallulog.tasks.qa import QAParts
from hallulog.tasks.records import MISSING, RecordAt, iter_records

__all__ = [
    "ConvertContext",
    "RecordSource",
    "Converter",
    "generic_records",
    "text_field",
    "id_field",
    "first_key",
    "Bad",
]


@dataclass(frozen=True)
class ConvertContext:
    """What a preset's converter may need besides the record."""

    path: Path
    answer_kind: str
    with_context: bool


class RecordSource(Protocol):
    def __call__(
        self,
        path: Path,
        *,
        split: str | None,
        collector: MalformedCollector,
        fmt: str,
        records_key: str | None,
    ) -> Iterator[RecordAt]: ...


#: a record → its parts, a message (malformed), or None (skipped without a warning)
Converter = Callable[[RecordAt, ConvertContext], QAParts | str | None]


def generic_records(
    path: Path,
    *,
    split: str | None,
    collector: MalformedCollector,
    fmt: str,
    records_key: str | None,
) -> Iterator[RecordAt]:
    """The records of ``path`` as ``records.iter_records`` reads them."""
    return iter_records(path, fmt=fmt, records_key=records_key, split=split, collector=collector)


class Bad(HallulogError, ValueError):
    """A malformed record (its message is the collector's)."""


def first_key(record: dict[str, Any], *keys: str) -> tuple[str, Any]:
    """The first of ``keys`` the record has (not null), and its value; ``MISSING`` if none."""
    for key in keys:
        if record.get(key) is not None:
            return key, record[key]
    return keys[0], MISSING


def text_field(record: dict[str, Any], *keys: str, required: bool = True) -> str | None:
    """The stripped string under the first present key of ``keys``; raises :class:`Bad` when it
    is missing (if ``required``), not a string, or blank (if ``required``)."""
    key, value = first_key(record, *keys)
    if value is MISSING:
        if required:
            raise Bad(f'missing field "{key}"')
        return None
    if not isinstance(value, str):
        raise Bad(f'field "{key}" must be a string, got {type(value).__name__}')
    if not value.strip():
        if required:
            raise Bad(f'field "{key}" is empty')
        return None
    return value.strip()


def id_field(record: dict[str, Any], *keys: str) -> str:
    """The record's id under the first present key (a non-empty string or an integer)."""
    key, value = first_key(record, *keys)
    if value is MISSING or (isinstance(value, str) and not value.strip()):
        raise Bad(f'missing or empty id field "{key}"')
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise Bad(f'id field "{key}" must be a string or an integer, got {value!r}')
    return str(value).strip()

"""The generic field-mapped QA task: any record file (``records.iter_records``) → QA records.

```python
from hallulog.tasks.qa import FieldMapping, QAOptions, iter_qa_records
opts = QAOptions(mapping=FieldMapping(question="query", answers="gold", id="qid"),
                 answer_kind="aliases")
for rec in iter_qa_records("dev.csv", opts, limit=None, collector=collector):
    rec.dataset_id, rec.fields["question"], rec.reference, rec.meta
```

What a record becomes (the presets in ``hallulog.tasks.presets`` produce the same):

* ``fields`` (what a prompt template sees): ``question`` (str, stripped), ``context`` (str or
  None; a list of strings is joined with blank lines), ``choices`` (list[str] or None),
  ``choices_text`` (``"A. first\\nB. second"`` or None), ``letters`` (``["A", "B", ...]`` or
  None), ``answer`` (the reference answer as a few-shot example shows it: the letter for
  ``choice``, the number for ``numeric``, the first alias for ``aliases``, the value for
  ``judge``; None when there is none) and ``record`` (the raw record).
* ``reference``: ``{"kind", "value"}`` plus, per kind, ``aliases`` → ``"aliases"`` (and
  ``"unanswerable": True`` with ``"aliases": []`` when the answers are an empty list, as in
  SQuAD v2: graded correct only when the model abstains); ``choice`` → ``"choices"``,
  ``"answer_index"`` (value: the letter); ``numeric`` → ``"number"``, ``"tolerance"`` (value:
  the number written canonically, ``"1234"``, ``"0.75"``); ``judge`` → ``"document"`` (the
  context or None) and ``"aliases"`` when there are any.
* ``meta``: ``{"question"}`` plus ``"context"`` and ``"choices"`` when present; JSON-able.

Field values: answers may be a string, a number, a list of strings/numbers (nested lists are
flattened), a JSON-encoded list in a CSV cell (``["a", "b"]``), an object with a ``text`` list
(Hugging Face SQuAD) or a list of ``{"text": ...}`` (released SQuAD). Choices may be a list, a
JSON-encoded list, an object with ``text`` (and ``label``) lists (ARC), or several fields
(``FieldMapping(choices="A,B,C,D")``); the choice answer may be a letter, a 0-based index (int
or digit string), one of the record's own labels, or the choice's text. A numeric answer may be
a number or a text such as GSM8K's ``"...#### 1,234"`` or ``"3/4"``.

A missing or mistyped mapped field makes the record malformed (skipped, reported by the
collector naming the field and its flag, e.g. ``missing field "query" (--question-field)``); a
duplicate id too. ``dataset_id`` is the id field's value as a string, else the 0-based record
index. A file without a single valid record raises ``DatasetFormatError``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from hallulog.tasks.base import GroupCounter, MalformedCollector
from hallulog.tasks.qa_values import (
    LETTERS,
    dedup,
    format_number,
    join_context,
    maybe_json_list,
    parse_aliases,
    parse_choices,
    parse_number,
    resolve_choice,
)
from hallulog.tasks.records import FORMATS, MISSING, RecordAt, get_field, iter_records, report

__all__ = [
    "ANSWER_KINDS",
    "FIELD_FLAGS",
    "LETTERS",
    "FieldMapping",
    "QAOptions",
    "QARecord",
    "QAParts",
    "iter_qa_records",
    "map_record",
    "build_record",
    "iter_built",
    "parse_aliases",
    "parse_choices",
    "resolve_choice",
    "parse_number",
    "format_number",
    "dedup",
    "join_context",
]

log = logging.getLogger(__name__)

ANSWER_KINDS: tuple[str, ...] = ("aliases", "choice", "numeric", "judge")
#: the command-line flag of each mapping field (named in malformed-record messages)
FIELD_FLAGS = {
    "question": "--question-field",
    "answers": "--answers-field",
    "id": "--id-field",
    "context": "--context-field",
    "choices": "--choices-field",
}
_DEFAULT_ANSWER_KEYS = ("answer", "answers")
_DEFAULT_CHOICE_KEYS = ("choices", "options")


@dataclass(frozen=True)
class FieldMapping:
    """Which record field holds what (dotted keys reach into nested objects)."""

    question: str = "question"
    answers: str | None = None
    """Default: ``answer``, else ``answers``."""
    id: str | None = None
    """Default: the 0-based record index."""
    context: str | None = None
    choices: str | tuple[str, ...] | None = None
    """One field holding the list, or several fields (a tuple, or names joined by commas) each
    holding one choice. Default for ``choice``: ``choices``, else ``options``."""


@dataclass(frozen=True)
class QAOptions:
    """How to read a QA file."""

    mapping: FieldMapping = field(default_factory=FieldMapping)
    answer_kind: str = "aliases"
    numeric_tolerance: float = 1e-6
    """Passed on in numeric references; the numeric grader owns the comparison."""
    fmt: str = "auto"
    records_key: str | None = None
    split: str | None = None
    """The split of a DatasetDict directory to read (other formats: not used here)."""

    def __post_init__(self) -> None:
        if self.answer_kind not in ANSWER_KINDS:
            raise ValueError(
                f"unknown answer kind {self.answer_kind!r}; choose one of {', '.join(ANSWER_KINDS)}"
            )
        tol = self.numeric_tolerance
        if (
            isinstance(tol, bool)
            or not isinstance(tol, (int, float))
            or not math.isfinite(tol)
            or tol < 0
        ):
            raise ValueError(f"numeric_tolerance must be a finite number >= 0, got {tol!r}")
        if self.fmt not in FORMATS:
            raise ValueError(f"unknown format {self.fmt!r}; choose one of {', '.join(FORMATS)}")


class QARecord(NamedTuple):
    """One valid QA record: where it is, its id, template fields, reference and meta."""

    line: int | None
    index: int
    dataset_id: str
    fields: dict[str, Any]
    reference: dict[str, Any]
    meta: dict[str, Any]


@dataclass
class QAParts:
    """What a record says, before the answer kind shapes it (see :func:`build_record`)."""

    question: str
    dataset_id: str | None = None
    """None: the record index."""
    context: str | None = None
    aliases: list[str] | None = None
    """None: no text answer given; ``[]`` with ``unanswerable``: none exists."""
    unanswerable: bool = False
    choices: list[str] | None = None
    answer_index: int | None = None
    number: float | None = None
    value: str | None = None
    """The canonical answer text when it is not the first alias (TruthfulQA's best answer)."""
    reference_extra: dict[str, Any] = field(default_factory=dict)
    meta_extra: dict[str, Any] = field(default_factory=dict)
    meta_context: bool = True
    """Whether ``meta`` keeps the context (presets: only when the prompt uses it)."""


# ----------------------------------------------------------------------------- building records


def build_record(at: RecordAt, parts: QAParts, kind: str, tolerance: float) -> QARecord | str:
    """The :class:`QARecord` of ``parts`` under answer kind ``kind``, or a message saying why
    the record cannot be graded that way."""
    choices = parts.choices
    letters = list(LETTERS[: len(choices)]) if choices else None
    aliases = list(parts.aliases or [])
    if not aliases and not parts.unanswerable:  # derive a text answer from the other forms
        if choices and parts.answer_index is not None:
            aliases = [choices[parts.answer_index]]
        elif parts.number is not None:
            aliases = [format_number(parts.number)]
    value = parts.value or (aliases[0] if aliases else None)
    if value is not None and value not in aliases:
        aliases.insert(0, value)
    reference: dict[str, Any] = {"kind": kind, "value": value}
    if kind == "aliases":
        if not aliases and not parts.unanswerable:
            return "no reference answer"
        reference["aliases"] = aliases
        if parts.unanswerable:
            reference.update(value=None, aliases=[], unanswerable=True)
        answer = reference["value"]
    elif kind == "choice":
        if not choices or letters is None or parts.answer_index is None:
            return "no choices with a resolved answer (answer kind choice)"
        answer = letters[parts.answer_index]
        reference.update(value=answer, choices=choices, answer_index=parts.answer_index)
    elif kind == "numeric":
        if parts.number is None:
            return "no numeric answer (answer kind numeric)"
        answer = format_number(parts.number)
        reference.update(value=answer, number=parts.number, tolerance=float(tolerance))
    else:  # judge
        if parts.unanswerable:
            reference.update(value=None, unanswerable=True)
        elif aliases:
            reference["aliases"] = aliases
        reference["document"] = parts.context
        answer = reference["value"]
    reference.update(parts.reference_extra)
    fields = {
        "question": parts.question,
        "context": parts.context,
        "choices": choices,
        "choices_text": "\n".join(f"{ltr}. {c}" for ltr, c in zip(letters, choices))
        if choices and letters
        else None,
        "letters": letters,
        "answer": answer,
        "record": at.record,
    }
    meta: dict[str, Any] = {"question": parts.question}
    if parts.context is not None and parts.meta_context:
        meta["context"] = parts.context
    if choices:
        meta["choices"] = choices
    meta.update(parts.meta_extra)
    dataset_id = parts.dataset_id if parts.dataset_id is not None else str(at.index)
    return QARecord(at.line, at.index, dataset_id, fields, reference, meta)


class _IdCounter(GroupCounter):
    """GroupCounter whose duplicate messages name lines or record numbers."""

    def __init__(self, collector: MalformedCollector, limit: int | None) -> None:
        super().__init__(collector, limit, "id")
        # id -> where it was first seen: a line number, or -(record number) for line-less
        # formats (an int, not a string: this map holds every id of the file)
        self._first: dict[str, int] = {}

    def admit_at(self, line: int | None, index: int, record_id: str) -> bool:
        where = line if line is not None else -(index + 1)
        first = self._first.setdefault(record_id, where)
        if first != where:
            seen = f"line {first}" if first > 0 else f"record {-first}"
            report(self.collector, line, index, f"duplicate id {record_id!r} (first at {seen})")
            return False
        self.count += 1
        return True


def iter_built(
    path: str | Path,
    records: Iterable[RecordAt],
    convert: Callable[[RecordAt], QAParts | str | None],
    *,
    kind: str,
    tolerance: float,
    limit: int | None,
    collector: MalformedCollector,
    what: str = "record",
) -> Iterator[QARecord]:
    """The valid records of ``records``: ``convert`` gives parts, a message (malformed) or None
    (skipped silently); duplicates are malformed; ``limit`` stops the read after N valid ones.
    A file without a valid record raises ``DatasetFormatError`` once read to the end."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    counter = _IdCounter(collector, limit)
    for at in records:
        parts = convert(at)
        if parts is None:
            continue
        built = parts if isinstance(parts, str) else build_record(at, parts, kind, tolerance)
        if isinstance(built, str):
            report(collector, at.line, at.index, built)
        elif counter.admit_at(at.line, at.index, built.dataset_id):
            yield built
            if counter.full:
                return
    counter.check_some(str(path), what)


# ----------------------------------------------------------------------------- field mapping


def _lookup(record: dict[str, Any], keys: tuple[str, ...]) -> tuple[str, Any]:
    for key in keys:
        value = get_field(record, key, None)
        if value is not None:
            return key, value
    return keys[0], MISSING


def _named(keys: tuple[str, ...]) -> str:
    return " or ".join(f'"{k}"' for k in keys)


def map_record(at: RecordAt, options: QAOptions) -> QAParts | str:
    """The parts of one record under ``options.mapping``, or a message naming the field (and
    its flag) that is missing or mistyped."""
    m, rec, kind = options.mapping, at.record, options.answer_kind

    def missing(keys: tuple[str, ...], flag: str) -> str:
        return f"missing field {_named(keys)} ({FIELD_FLAGS[flag]})"

    def mistyped(key: str, flag: str, want: str, got: Any) -> str:
        shown = repr(got) if len(repr(got)) <= 60 else repr(got)[:57] + "..."
        return f'field "{key}" ({FIELD_FLAGS[flag]}) must be {want}, got {shown}'

    _, question = _lookup(rec, (m.question,))
    if question is MISSING:
        return missing((m.question,), "question")
    if not isinstance(question, str):
        return mistyped(m.question, "question", "a string", question)
    if not question.strip():
        return f'field "{m.question}" ({FIELD_FLAGS["question"]}) is empty'
    parts = QAParts(question=question.strip())
    if m.id is not None:
        _, rid = _lookup(rec, (m.id,))
        if rid is MISSING or (isinstance(rid, str) and not rid.strip()):
            return missing((m.id,), "id")
        if isinstance(rid, bool) or not isinstance(rid, (str, int)):
            return mistyped(m.id, "id", "a string or an integer", rid)
        parts.dataset_id = str(rid).strip()
    if m.context is not None:
        _, ctx = _lookup(rec, (m.context,))
        if ctx is MISSING:
            return missing((m.context,), "context")
        context = join_context(ctx)
        if context is False:
            return mistyped(m.context, "context", "a string or a list of strings", ctx)
        parts.context = context if isinstance(context, str) else None
    answer_keys = (m.answers,) if m.answers else _DEFAULT_ANSWER_KEYS
    akey, answer = _lookup(rec, answer_keys)
    if answer is MISSING:
        if kind == "judge" and m.answers is None:
            return parts  # a judge can grade without a reference answer
        return missing(answer_keys, "answers")
    if kind == "choice":
        choice_keys = _choice_keys(m.choices)
        if len(choice_keys) > 1 and m.choices is not None:
            values = [get_field(rec, k, None) for k in choice_keys]
            absent = [k for k, v in zip(choice_keys, values) if v is None]
            if absent:
                return missing(tuple(absent), "choices")
            ckey, cvalue = ",".join(choice_keys), values
        else:
            ckey, cvalue = _lookup(rec, choice_keys)
            if cvalue is MISSING:
                return missing(choice_keys, "choices")
        parsed = parse_choices(cvalue)
        if parsed is None:
            return mistyped(ckey, "choices", f"a list of 1 to {len(LETTERS)} strings", cvalue)
        parts.choices, labels = parsed
        parts.answer_index = resolve_choice(answer, parts.choices, labels)
        if parts.answer_index is None:
            return (
                f'field "{akey}" ({FIELD_FLAGS["answers"]}): answer {answer!r} matches '
                f"none of the {len(parts.choices)} choices (a letter, a 0-based index or "
                "a choice's text)"
            )
    elif kind == "numeric":
        parts.number = parse_number(answer)
        if parts.number is None:
            return mistyped(akey, "answers", "a number (or a text ending in one)", answer)
    else:
        aliases = parse_aliases(answer)
        if aliases is None:
            return mistyped(akey, "answers", "a string or a list of strings", answer)
        if not aliases and not (
            isinstance(answer, (list, tuple, dict))
            or isinstance(maybe_json_list(str(answer)), list)
        ):
            return f'field "{akey}" ({FIELD_FLAGS["answers"]}) is empty'
        parts.aliases, parts.unanswerable = aliases, not aliases
    return parts


def _choice_keys(choices: str | tuple[str, ...] | None) -> tuple[str, ...]:
    if choices is None:
        return _DEFAULT_CHOICE_KEYS
    if isinstance(choices, str):
        return tuple(c.strip() for c in choices.split(",") if c.strip()) or (choices,)
    return tuple(choices)


def iter_qa_records(
    path: str | Path, options: QAOptions, *, limit: int | None = None, collector: MalformedCollector
) -> Iterator[QARecord]:
    """The valid QA records of ``path`` in file order, read lazily (see the module docstring)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    records = iter_records(
        path,
        fmt=options.fmt,
        records_key=options.records_key,
        split=options.split,
        collector=collector,
    )
    return iter_built(
        path,
        records,
        lambda at: map_record(at, options),
        kind=options.answer_kind,
        tolerance=options.numeric_tolerance,
        limit=limit,
        collector=collector,
    )

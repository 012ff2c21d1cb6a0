"""TriviaQA loader: the released ``*-dev.json`` files, one question object per JSONL line, or
the Hugging Face layout (``mandarjoshi/trivia_qa``, any config: Parquet, a ``save_to_disk``
directory, or its rows as JSON Lines).

Released file (e.g. ``unfiltered-web-dev.json``)::

    {"Data": [{"Question": ..., "QuestionId": ..., "Answer": {"Value": ..., "Aliases": [...],
               "NormalizedAliases": [...], ...}, ...}, ...],
     "Domain": ..., "Split": "dev", "Version": 1.0, "VerifiedEval": false}

Hugging Face row (``rc.nocontext``; the other configs add context)::

    {"question": ..., "question_id": ..., "question_source": ...,
     "answer": {"value": ..., "aliases": [...], "normalized_aliases": [...], "type": ..., ...},
     "entity_pages": {...}, "search_results": {...}}

A row is read as the released item it was made from (``question_id`` → ``QuestionId``,
``answer.value`` → ``Answer.Value``, ...), so the same question gets the same prompt id and
reference from either layout (the split named in the ids is ``--split``, default ``dev``).

The JSON document is scanned item by item (``json.JSONDecoder.raw_decode``) so that every error
names the line where the offending item starts, not just "somewhere in the file".
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hallulog.contracts.answer_kinds import answer_kind, grade_answer
from hallulog.contracts.answer_match import normalize_answer
from hallulog.contracts.prompt_group import PromptGroup
from hallulog.tasks.base import (
    DatasetFormatError,
    FileKindError,
    GroupCounter,
    LineCounter,
    MalformedCollector,
    iter_jsonl,
    read_text,
    skip_ws,
)
from hallulog.tasks.records import detect_format, iter_records, record_number
from hallulog.tasks.records_json import AFTER_DOCUMENT
from hallulog.tasks.verdict import ALIAS_GRADER, Verdict, detect_abstention, reference_of

__all__ = ["PROMPT_TEMPLATE", "DEFAULT_SPLIT", "iter_groups", "build_prompt", "AliasGrader"]

DATASET = "triviaqa"
DEFAULT_SPLIT = "dev"
PROMPT_TEMPLATE = "Answer the question with a short answer.\nQuestion: {question}\nAnswer:"

_DECODER = json.JSONDecoder()


def build_prompt(question: str) -> list[dict[str, str]]:
    """One user message, no system message."""
    return [{"role": "user", "content": PROMPT_TEMPLATE.format(question=question.strip())}]


def _dedup(values: list[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for v in values:
        if v not in seen:
            seen.add(v)
            out.append(v)
    return out


def _str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


#: names in the checks' messages → the Hugging Face row's
_HF_NAMES = {
    '"QuestionId"': '"question_id"',
    '"Question"': '"question"',
    '"Answer.Value"': '"answer.value"',
    '"Answer.Aliases"': '"answer.aliases"',
    '"Answer.NormalizedAliases"': '"answer.normalized_aliases"',
    '"Answer" object': '"answer" object',
}


def _hf_row_as_item(row: dict[str, Any]) -> dict[str, Any]:
    """A Hugging Face ``trivia_qa`` row as the released item (HumanAnswers and Difficulty,
    which the row lacks, stay absent)."""
    item: dict[str, Any] = {"QuestionId": row.get("question_id"), "Question": row.get("question")}
    answer = row.get("answer")
    if isinstance(answer, dict):
        item["Answer"] = {
            "Value": answer.get("value"),
            "Aliases": answer.get("aliases"),
            "NormalizedAliases": answer.get("normalized_aliases"),
        }
        if isinstance(answer.get("type"), str) and answer["type"]:
            item["Answer"]["Type"] = answer["type"]
    if isinstance(row.get("question_source"), str) and row["question_source"]:
        item["QuestionSource"] = row["question_source"]
    return item


def _check_record(record: Any) -> tuple[str, str, dict[str, Any], dict[str, Any]] | str:
    """:func:`_check_item` of a released item or of a Hugging Face row (messages name the
    row's fields)."""
    if not isinstance(record, dict) or "QuestionId" in record or "question_id" not in record:
        return _check_item(record)
    checked = _check_item(_hf_row_as_item(record))
    if isinstance(checked, str):
        for released, hf in _HF_NAMES.items():
            checked = checked.replace(released, hf)
    return checked


def _check_item(item: Any) -> tuple[str, str, dict[str, Any], dict[str, Any]] | str:
    """``(question_id, question, reference, meta)`` or a message saying what is wrong."""
    if not isinstance(item, dict):
        return f"expected a question object, got {type(item).__name__}"
    qid = item.get("QuestionId")
    where = f"item {qid!r}: " if isinstance(qid, (str, int)) and qid != "" else ""
    if not isinstance(qid, (str, int)) or isinstance(qid, bool) or str(qid).strip() == "":
        return 'missing or empty "QuestionId"'
    question = item.get("Question")
    if not isinstance(question, str) or not question.strip():
        return where + 'missing or empty "Question"'
    answer = item.get("Answer")
    if not isinstance(answer, dict):
        return where + 'missing "Answer" object'
    value = answer.get("Value")
    if not isinstance(value, str) or not value.strip():
        return where + 'missing or empty "Answer.Value"'
    aliases = answer.get("Aliases")
    if not _str_list(aliases):
        return where + '"Answer.Aliases" must be a list of strings'
    norm_aliases = answer.get("NormalizedAliases")
    if norm_aliases is None:
        norm_aliases = [normalize_answer(a) for a in aliases]
    elif not _str_list(norm_aliases):
        return where + '"Answer.NormalizedAliases" must be a list of strings'
    human = answer.get("HumanAnswers", [])
    if not _str_list(human):
        return where + '"Answer.HumanAnswers" must be a list of strings'
    all_aliases = _dedup([value, *aliases, *human])
    normalized = _dedup(
        [normalize_answer(value), *norm_aliases, *(normalize_answer(h) for h in human)]
    )
    normalized = [n for n in normalized if n]
    reference = {"value": value, "aliases": all_aliases, "normalized_aliases": normalized}
    meta: dict[str, Any] = {"question": question.strip()}
    if isinstance(answer.get("Type"), str):
        meta["answer_type"] = answer["Type"]
    for src, dst in (("QuestionSource", "question_source"), ("Difficulty", "difficulty")):
        if isinstance(item.get(src), str):
            meta[dst] = item[src]
    return str(qid), question, reference, meta


# ----------------------------------------------------------------------------- JSON document scan


def _expect(text: str, pos: int, char: str, path: str, lines: LineCounter, what: str) -> int:
    if pos >= len(text) or text[pos] != char:
        got = "end of file" if pos >= len(text) else repr(text[pos])
        raise DatasetFormatError(path, lines.line_at(pos), f"expected {what}, got {got}")
    return pos + 1


def _decode(text: str, pos: int, path: str, lines: LineCounter) -> tuple[Any, int]:
    try:
        return _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError as exc:
        raise DatasetFormatError(
            path, exc.lineno, f"invalid JSON: {exc.msg} (column {exc.colno})"
        ) from None


def _scan_array(
    text: str, pos: int, path: str, lines: LineCounter
) -> tuple[list[tuple[int, int]], int]:
    """``(start_line, start_offset)`` of each element of the array at ``pos`` (each is decoded
    once to find its end, then let go), and the position after the array."""
    items: list[tuple[int, int]] = []
    pos = skip_ws(text, _expect(text, pos, "[", path, lines, "'[' opening the list of questions"))
    if pos < len(text) and text[pos] == "]":
        return items, pos + 1
    while True:
        start = pos
        _item, pos = _decode(text, pos, path, lines)
        items.append((lines.line_at(start), start))
        pos = skip_ws(text, pos)
        if pos < len(text) and text[pos] == ",":
            pos = skip_ws(text, pos + 1)
            continue
        return items, _expect(text, pos, "]", path, lines, "',' or ']' in the list of questions")


def _scan_document(text: str, path: str) -> tuple[dict[str, Any], list[tuple[int, int]]]:
    """Header fields and ``(start_line, start_offset)`` of each item of a released TriviaQA
    JSON file (the header's ``Split`` may follow the ``Data`` list, so the whole document is
    scanned before any item is used).

    A top-level list of question objects is accepted too.
    """
    lines = LineCounter(text)
    pos = skip_ws(text, 0)
    if pos >= len(text):
        raise FileKindError(path, 1, "empty file")
    header: dict[str, Any] = {}
    items: list[tuple[int, int]] = []
    if text[pos] == "[":
        items, pos = _scan_array(text, pos, path, lines)
        pos = skip_ws(text, pos)
    elif text[pos] == "{":
        found_data = False
        pos = skip_ws(text, pos + 1)
        if pos < len(text) and text[pos] == "}":
            pos += 1
        else:
            while True:
                if pos >= len(text) or text[pos] != '"':
                    _expect(text, pos, '"', path, lines, "a quoted key in the top-level object")
                key, pos = _decode(text, pos, path, lines)
                pos = skip_ws(text, _expect(text, skip_ws(text, pos), ":", path, lines, "':'"))
                if key == "Data":
                    found_data = True
                    items, pos = _scan_array(text, pos, path, lines)
                    pos = skip_ws(text, pos)
                else:
                    header[key], pos = _decode(text, pos, path, lines)
                    pos = skip_ws(text, pos)
                if pos < len(text) and text[pos] == ",":
                    pos = skip_ws(text, pos + 1)
                    continue
                pos = _expect(text, pos, "}", path, lines, "',' or '}' in the top-level object")
                break
        if not found_data:
            raise FileKindError(
                path,
                1,
                'no "Data" list in the top-level object '
                "(expected a TriviaQA file like unfiltered-web-dev.json)",
            )
        pos = skip_ws(text, pos)
    else:
        raise FileKindError(
            path, lines.line_at(pos), 'expected a JSON object with a "Data" list or a JSON list'
        )
    if pos < len(text):
        raise FileKindError(path, lines.line_at(pos), AFTER_DOCUMENT)
    return header, items


# ----------------------------------------------------------------------------- loader


def _resolve_split(split: str | None, declared: Any, path: str) -> str:
    if declared is not None and not isinstance(declared, str):
        raise DatasetFormatError(path, 1, f'"Split" must be a string, got {declared!r}')
    if split is not None and declared is not None and split != declared:
        raise ValueError(
            f"{path}: split {split!r} was asked for but the file declares "
            f'"Split": {declared!r} (prompt ids depend on the split)'
        )
    return split or declared or DEFAULT_SPLIT


def iter_groups(
    path: str | Path, *, split: str | None, limit: int | None, collector: MalformedCollector
) -> Iterator[PromptGroup]:
    """The prompt groups of a TriviaQA file, read lazily (a JSONL file line by line; Parquet
    and ``save_to_disk`` directories batch by batch, ``split`` picking a DatasetDict's split; a
    JSON document is held as text, its items decoded one at a time)."""
    path_s = str(path)
    counter = GroupCounter(collector, limit, "QuestionId")
    kind = detect_format(path_s)
    if kind in ("csv", "tsv"):
        raise FileKindError(path_s, 1, f"a {kind.upper()} file, no TriviaQA layout")
    if kind != "json":
        the_split = split or DEFAULT_SPLIT
        if kind == "jsonl":
            records = ((line, obj) for line, _index, obj in iter_jsonl(path, collector))
        else:
            records = _numbered(iter_records(path_s, split=split, collector=collector))
        for line, obj in records:
            checked = _check_record(obj)
            if isinstance(checked, str):
                collector.add(line, checked if kind == "jsonl" else f"record {line}: {checked}")
            elif counter.admit(line, checked[0]):
                yield _group(the_split, checked)
                if counter.full:
                    break
        counter.check_some(path_s, "question")
        return
    text = read_text(path)
    header, items = _scan_document(text, path_s)
    the_split = _resolve_split(split, header.get("Split"), path_s)
    strict = MalformedCollector(path_s, strict=True)  # a bad item of a document is an error
    counter = GroupCounter(strict, None, "QuestionId")
    for start_line, start in items:  # every item is checked, also past ``limit``
        checked = _check_item(_DECODER.raw_decode(text, start)[0])
        if isinstance(checked, str):
            raise DatasetFormatError(path_s, start_line, checked)
        counter.admit(start_line, checked[0])
        if limit is None or counter.count <= limit:
            yield _group(the_split, checked)
    counter.check_some(path_s, "question")


def _numbered(records) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(record number, record)`` of a file without lines (Parquet, a datasets directory);
    the collector's messages then start ``record N:``."""
    for at in records:
        yield record_number(at.line, at.index), at.record


def _group(split: str, checked: tuple[str, str, dict[str, Any], dict[str, Any]]) -> PromptGroup:
    qid, question, reference, meta = checked
    return PromptGroup.create(
        DATASET, split, qid, build_prompt(question), reference=reference, meta=meta
    )


class AliasGrader:
    """The answers a worker can grade (aliases, choice and numeric references, by
    :func:`hallulog.contracts.answer_kinds.grade_answer`: the same rule as the worker's labels) plus the
    abstention phrase list (flag only). triviaqa's grader."""

    name = ALIAS_GRADER
    judge_model: str | None = None

    async def grade(self, prompt_row: dict, answer: str) -> Verdict:
        ref = reference_of(prompt_row)
        abstained = detect_abstention(answer)
        if "kind" not in ref and answer_kind(ref) is None:  # no aliases: the value is the alias
            ref = {"aliases": [ref["value"]]} if ref.get("value") else {}
        graded = grade_answer(ref, answer)
        if graded is None:
            return Verdict(None, self.name, "no_reference", abstained)
        # the verdict is the grade's status: correct, incorrect, unparsed, abstained (an
        # unanswerable question declined: label 0) or no_reference
        return Verdict(graded.label, graded.grader, graded.status, abstained)

    async def aclose(self) -> None:
        return None

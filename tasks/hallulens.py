"""Loaders for the HalluLens task files: precisewikiqa, longwiki, mixedentities.

Schemas (field by field, with their source in the HalluLens code) are in docs/tasks.md. In short:

* precisewikiqa / longwiki: JSONL, one generated question per line with ``prompt`` (the question),
  ``answer``, ``title``, ``h_score_cat``, ``pageid``, ``revid``, ``description``, ``categories``
  and ``reference`` (the Wikipedia section the question was generated from).
* mixedentities: the prompt file of the nonexistent-entities test, CSV (HalluLens writes it with
  pandas) or JSONL, with ``prompt``, ``name`` and ``type``; hallulog adds an optional ``exists``
  column so real and made-up names can be mixed (absent means made up, as in HalluLens).

Ids: the record's ``id`` field when it has one, else its 0-based record index (data rows for CSV,
non-blank lines for JSONL, malformed ones included so fixing a line renumbers nothing).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hallulog.contracts.prompt_group import PromptGroup
from hallulog.tasks.base import GroupCounter, MalformedCollector, iter_jsonl
from hallulog.tasks.records import iter_delimited

__all__ = [
    "DEFAULT_SPLIT",
    "QA_PROMPT_TEMPLATE",
    "ENTITY_PROMPT_TEMPLATES",
    "MIXED_PROMPT_TEMPLATE",
    "iter_precisewikiqa",
    "iter_longwiki",
    "iter_mixedentities",
]

DEFAULT_SPLIT = "test"

# HalluLens sends the generated question to the model as it is.
QA_PROMPT_TEMPLATE = "{prompt}"

# Used only for mixedentities rows that carry a name but no prompt (written for hallulog).
ENTITY_PROMPT_TEMPLATES: tuple[str, ...] = (
    "Tell me what you know about the {type} {name}.",
    "Please describe the {type} {name}.",
    "Give me a short overview of the {type} {name}.",
    "What is known about the {type} {name}?",
    "Write a few sentences about the {type} {name}.",
    "Summarize the main facts about the {type} {name}.",
)
MIXED_PROMPT_TEMPLATE = (
    "{prompt}\n--- rows without a prompt use template (record index mod "
    f"{len(ENTITY_PROMPT_TEMPLATES)}):\n" + "\n".join(ENTITY_PROMPT_TEMPLATES)
)

# Metadata fields kept in PromptGroup.meta when the record has them.
_WIKI_META = ("title", "h_score_cat", "pageid", "revid", "description", "categories")

_TRUE = {"true", "1", "yes", "y", "t"}
_FALSE = {"false", "0", "no", "n", "f", ""}


def _user(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def _record_id(obj: dict[str, Any], index: int) -> tuple[str, str | None]:
    """(dataset_id, error) — the record's ``id`` when present, else its index."""
    if "id" not in obj or obj["id"] is None:
        return str(index), None
    rid = obj["id"]
    if isinstance(rid, bool) or not isinstance(rid, (str, int)) or str(rid).strip() == "":
        return "", f'"id" must be a non-empty string or integer, got {rid!r}'
    return str(rid), None


def _nonempty_str(obj: dict[str, Any], *keys: str) -> str | None:
    for key in keys:
        value = obj.get(key)
        if isinstance(value, str) and value.strip():
            return value
    return None


def _iter_wiki_qa(
    dataset: str,
    path: str | Path,
    split: str | None,
    limit: int | None,
    collector: MalformedCollector,
    answer_required: bool,
) -> Iterator[PromptGroup]:
    split = split or DEFAULT_SPLIT
    counter = GroupCounter(collector, limit, "id")
    for lineno, index, obj in iter_jsonl(path, collector):
        question = _nonempty_str(obj, "prompt", "question")
        if question is None:
            collector.add(lineno, 'missing or empty "prompt" (the question)')
            continue
        answer = obj.get("answer")
        if answer is not None and not isinstance(answer, str):
            collector.add(lineno, f'"answer" must be a string, got {type(answer).__name__}')
            continue
        if answer_required and (answer is None or not answer.strip()):
            collector.add(lineno, 'missing or empty "answer"')
            continue
        document = obj.get("reference")
        if document is not None and not isinstance(document, str):
            collector.add(lineno, f'"reference" must be a string, got {type(document).__name__}')
            continue
        dataset_id, err = _record_id(obj, index)
        if err:
            collector.add(lineno, err)
            continue
        # No "aliases" key: that marks alias-gradable (triviaqa) references for the worker;
        # these tasks are graded by the judge against ``value`` and ``document``.
        reference: dict[str, Any] = {"value": answer, "document": document}
        meta = {"question": question.strip()}
        meta.update({k: obj[k] for k in _WIKI_META if k in obj})
        if counter.admit(lineno, dataset_id):
            yield PromptGroup.create(
                dataset, split, dataset_id, _user(question.strip()), reference=reference, meta=meta
            )
            if counter.full:
                break
    counter.check_some(str(path), "record")


def iter_precisewikiqa(
    path: str | Path, *, split: str | None, limit: int | None, collector: MalformedCollector
) -> Iterator[PromptGroup]:
    """PreciseWikiQA generated QA pairs (JSONL, read lazily); ``answer`` is required."""
    return _iter_wiki_qa("precisewikiqa", path, split, limit, collector, answer_required=True)


def iter_longwiki(
    path: str | Path, *, split: str | None, limit: int | None, collector: MalformedCollector
) -> Iterator[PromptGroup]:
    """LongWiki questions (JSONL, read lazily); ``answer`` is optional (HalluLens grades
    against the wiki)."""
    return _iter_wiki_qa("longwiki", path, split, limit, collector, answer_required=False)


# ----------------------------------------------------------------------------- mixedentities


def _parse_exists(value: Any) -> bool | None:
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        v = value.strip().lower()
        if v in _TRUE:
            return True
        if v in _FALSE:
            return False
    return None


def _csv_records(
    path: str, collector: MalformedCollector
) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """``(start_line, row_index, row)`` for each data row of a CSV file with a header, read as
    a stream (:func:`hallulog.tasks.records.iter_delimited`)."""
    for rec in iter_delimited(path, collector):
        yield rec.line, rec.index, rec.record


def iter_mixedentities(
    path: str | Path, *, split: str | None, limit: int | None, collector: MalformedCollector
) -> Iterator[PromptGroup]:
    """Nonexistent-entity prompts (CSV as HalluLens writes it, or JSONL), read lazily."""
    path_s = str(path)
    split = split or DEFAULT_SPLIT
    counter = GroupCounter(collector, limit, "id")
    if Path(path_s).suffix.lower() == ".csv":
        records = _csv_records(path_s, collector)
    else:
        records = iter_jsonl(path, collector)
    for lineno, index, obj in records:
        name = _nonempty_str(obj, "name")
        if name is None:
            collector.add(lineno, 'missing or empty "name"')
            continue
        etype = _nonempty_str(obj, "type", "type_")
        if etype is None:
            collector.add(lineno, 'missing or empty "type"')
            continue
        exists = _parse_exists(obj.get("exists"))
        if exists is None:
            collector.add(lineno, f'"exists" must be true or false, got {obj.get("exists")!r}')
            continue
        dataset_id, err = _record_id(obj, index)
        if err:
            collector.add(lineno, err)
            continue
        prompt = _nonempty_str(obj, "prompt")
        from_template = prompt is None
        if prompt is None:
            template = ENTITY_PROMPT_TEMPLATES[index % len(ENTITY_PROMPT_TEMPLATES)]
            prompt = template.format(type=etype.strip(), name=name.strip())
        reference = {"value": None, "name": name.strip(), "type": etype.strip(), "exists": exists}
        meta = {
            "question": prompt.strip(),
            "entity_name": name.strip(),
            "entity_type": etype.strip(),
            "entity_exists": exists,
            "prompt_from_template": from_template,
        }
        if counter.admit(lineno, dataset_id):
            yield PromptGroup.create(
                "mixedentities",
                split,
                dataset_id,
                _user(prompt.strip()),
                reference=reference,
                meta=meta,
            )
            if counter.full:
                break
    counter.check_some(path_s, "record")

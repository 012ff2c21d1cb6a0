"""Open-answer presets: nq_open, squad, hotpotqa, popqa, truthfulqa, bioasq.

Each reads the file as the dataset releases it (layouts in docs/tasks.md and in each function's
docstring) and turns a record into :class:`~hallulog.tasks.qa.QAParts`; the Hugging Face
exports of the same sets (parquet or ``save_to_disk``, same field names) are read too where noted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hallulog.tasks.base import MalformedCollector
from hallulog.tasks.presets._common import Bad, ConvertContext, first_key, id_field, text_field
from hallulog.tasks.qa import QAParts, dedup, join_context, parse_aliases
from hallulog.tasks.records import MISSING, JsonDocument, RecordAt, detect_format, iter_records

__all__ = ["nq_open", "squad_records", "squad", "hotpotqa", "popqa", "truthfulqa", "bioasq"]


def _aliases(record: dict[str, Any], *keys: str, allow_empty: bool = False) -> list[str]:
    key, value = first_key(record, *keys)
    if value is MISSING:
        raise Bad(f'missing field "{key}"')
    aliases = parse_aliases(value)
    if aliases is None:
        raise Bad(
            f'field "{key}" must be a string or a list of strings, got {type(value).__name__}'
        )
    if not aliases and not allow_empty:
        raise Bad(f'field "{key}" holds no answer')
    return aliases


# ----------------------------------------------------------------------------- nq_open


def nq_open(at: RecordAt, ctx: ConvertContext) -> QAParts:
    """NQ-Open (``NQ-open.dev.jsonl``): ``{"question": "...", "answer": ["...", ...]}``; ids
    are record indexes."""
    return QAParts(
        question=text_field(at.record, "question") or "", aliases=_aliases(at.record, "answer")
    )


# ----------------------------------------------------------------------------- squad


def squad_records(
    path: Path,
    *,
    split: str | None,
    collector: MalformedCollector,
    fmt: str,
    records_key: str | None,
) -> Iterator[RecordAt]:
    """The questions of a released SQuAD file (``dev-v2.0.json``: ``data`` → articles →
    ``paragraphs`` → ``qas``), one record each with the paragraph's ``context`` and the article's
    ``title`` added; the line is where the question object starts. Other formats (the Hugging
    Face export: one question a row) are read as they are."""
    if detect_format(path, fmt) != "json":
        yield from iter_records(
            path, fmt=fmt, records_key=records_key, split=split, collector=collector
        )
        return
    doc = JsonDocument(path)
    index = -1
    for a_pos, article in doc.items(doc.locate(records_key or "data")):
        title = article.get("title") if isinstance(article, dict) else None
        p_pos = doc.find_key(a_pos, "paragraphs")
        if p_pos is None or not isinstance(article.get("paragraphs"), list):
            collector.add(doc.line_at(a_pos), 'expected an article object with a "paragraphs" list')
            continue
        for par_pos, paragraph in doc.items(p_pos):
            q_pos = doc.find_key(par_pos, "qas")
            if q_pos is None or not isinstance(paragraph.get("qas"), list):
                collector.add(doc.line_at(par_pos), 'expected a paragraph object with a "qas" list')
                continue
            for qa_pos, qa in doc.items(q_pos):
                index += 1
                line = doc.line_at(qa_pos)
                if not isinstance(qa, dict):
                    collector.add(line, f"expected a question object, got {type(qa).__name__}")
                    continue
                yield RecordAt(
                    line, index, {**qa, "context": paragraph.get("context"), "title": title}
                )


def squad(at: RecordAt, ctx: ConvertContext) -> QAParts:
    """SQuAD v1.1 / v2.0: id = the question's ``id``; context = its paragraph. A v2.0 question
    with ``is_impossible: true`` (or, in the HF export, no answer texts) has no answer: its
    reference is ``aliases: [], unanswerable: true``."""
    rec = at.record
    context = text_field(rec, "context")
    parts = QAParts(
        question=text_field(rec, "question") or "",
        dataset_id=id_field(rec, "id"),
        context=context,
        meta_context=ctx.with_context,
    )
    if rec.get("is_impossible") is True:
        parts.aliases, parts.unanswerable = [], True
    else:
        parts.aliases = _aliases(rec, "answers", allow_empty=True)
        parts.unanswerable = not parts.aliases
    if isinstance(rec.get("title"), str):
        parts.meta_extra["title"] = rec["title"]
    return parts


# ----------------------------------------------------------------------------- hotpotqa


def _hotpot_context(value: Any) -> str | None:
    """``[[title, [sentence, ...]], ...]`` (released) or ``{"title": [...], "sentences":
    [[...], ...]}`` (HF) → ``"title: sentences"`` paragraphs joined by blank lines."""
    if isinstance(value, dict):
        value = list(zip(value.get("title") or [], value.get("sentences") or []))
    if not isinstance(value, list):
        raise Bad('field "context" must be a list of [title, sentences] pairs')
    paragraphs = []
    for item in value:
        if not (
            isinstance(item, (list, tuple))
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], list)
            and all(isinstance(s, str) for s in item[1])
        ):
            raise Bad('field "context" must be a list of [title, sentences] pairs')
        text = " ".join(s.strip() for s in item[1] if s.strip())
        paragraphs.append(f"{item[0].strip()}: {text}")
    return "\n\n".join(paragraphs) or None


def hotpotqa(at: RecordAt, ctx: ConvertContext) -> QAParts:
    """HotpotQA (``hotpot_dev_distractor_v1.json``): a list of ``{"_id", "question", "answer",
    "type", "level", "supporting_facts", "context"}``; id = ``_id`` (HF export: ``id``)."""
    rec = at.record
    parts = QAParts(
        question=text_field(rec, "question") or "",
        dataset_id=id_field(rec, "_id", "id"),
        aliases=_aliases(rec, "answer"),
        meta_context=ctx.with_context,
    )
    if rec.get("context") is not None:
        parts.context = _hotpot_context(rec["context"])
    parts.meta_extra = {k: rec[k] for k in ("type", "level") if isinstance(rec.get(k), str)}
    return parts


# ----------------------------------------------------------------------------- popqa


def popqa(at: RecordAt, ctx: ConvertContext) -> QAParts:
    """PopQA (``popQA.tsv``, or the HF export with the same columns): aliases =
    ``possible_answers`` (a JSON-encoded list); id = ``id``; meta keeps ``prop`` and ``s_pop``."""
    rec = at.record
    parts = QAParts(
        question=text_field(rec, "question") or "",
        dataset_id=id_field(rec, "id"),
        aliases=_aliases(rec, "possible_answers"),
    )
    if isinstance(rec.get("prop"), str):
        parts.meta_extra["prop"] = rec["prop"]
    pop = rec.get("s_pop")
    if isinstance(pop, str) and pop.strip().lstrip("-").isdigit():
        pop = int(pop)
    if isinstance(pop, int) and not isinstance(pop, bool):
        parts.meta_extra["s_pop"] = pop
    return parts


# ----------------------------------------------------------------------------- truthfulqa


def _answer_list(record: dict[str, Any], *keys: str) -> list[str]:
    """A ``"; "``-separated cell (released CSV) or a list (HF export)."""
    key, value = first_key(record, *keys)
    if value is MISSING:
        raise Bad(f'missing field "{key}"')
    if isinstance(value, str):
        return dedup(value.split(";"))
    aliases = parse_aliases(value)
    if aliases is None:
        raise Bad(f'field "{key}" must be a "; "-separated text or a list of strings')
    return aliases


def truthfulqa(at: RecordAt, ctx: ConvertContext) -> QAParts:
    """TruthfulQA generation set (``TruthfulQA.csv``: ``Type, Category, Question, Best Answer,
    Correct Answers, Incorrect Answers, Source``; the HF export's snake_case names too). Value =
    Best Answer; aliases = Best Answer + Correct Answers; ``incorrect_answers`` joins the
    reference; ids are record indexes; meta keeps ``category`` and ``type``."""
    rec = at.record
    best = text_field(rec, "Best Answer", "best_answer")
    correct = _answer_list(rec, "Correct Answers", "correct_answers")
    incorrect = _answer_list(rec, "Incorrect Answers", "incorrect_answers")
    parts = QAParts(
        question=text_field(rec, "Question", "question") or "",
        aliases=dedup([best or "", *correct]),
        value=best,
        reference_extra={"incorrect_answers": incorrect},
    )
    for keys, dst in ((("Category", "category"), "category"), (("Type", "type"), "type")):
        value = text_field(rec, *keys, required=False)
        if value is not None:
            parts.meta_extra[dst] = value
    return parts


# ----------------------------------------------------------------------------- bioasq


def bioasq(at: RecordAt, ctx: ConvertContext) -> QAParts | None:
    """BioASQ training/test JSON (``{"questions": [{"id", "body", "type", "exact_answer",
    "ideal_answer", "snippets", "documents"}]}``): only ``factoid`` questions are kept; the
    others (yesno, list, summary) are skipped without a warning. Aliases = ``exact_answer``
    flattened (a list of synonym lists, or a list of strings); context = the snippets' texts
    joined by blank lines."""
    rec = at.record
    if rec.get("type") != "factoid":
        return None
    parts = QAParts(
        question=text_field(rec, "body") or "",
        dataset_id=id_field(rec, "id"),
        aliases=_aliases(rec, "exact_answer"),
        meta_context=ctx.with_context,
    )
    snippets = rec.get("snippets") or []
    if not isinstance(snippets, list) or not all(isinstance(s, dict) for s in snippets):
        raise Bad('field "snippets" must be a list of objects')
    context = join_context([s["text"] for s in snippets if isinstance(s.get("text"), str)])
    parts.context = context if isinstance(context, str) else None
    return parts

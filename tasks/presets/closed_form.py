"""Presets with choices or numbers: sciq, mmlu (multiple choice), gsm8k, svamp (numeric)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hallulog.tasks.base import MalformedCollector
from hallulog.tasks.presets._common import Bad, ConvertContext, first_key, id_field, text_field
from hallulog.tasks.qa import QAParts, parse_choices, parse_number, resolve_choice
from hallulog.tasks.records import MISSING, RecordAt, detect_format, iter_delimited, iter_records

__all__ = ["sciq", "sciq_order", "mmlu_records", "mmlu", "gsm8k", "svamp", "MMLU_COLUMNS"]


# ----------------------------------------------------------------------------- sciq


def sciq_order(question: str, options: list[str]) -> list[int]:
    """The deterministic order of a SciQ record's options: sorted by
    ``sha256(question + "\\x1f" + slot + "\\x1f" + option)`` (slot: 0 for the correct answer,
    1-3 for distractor1-3), so every run and every language gets the same choices."""

    def key(i: int) -> str:
        return hashlib.sha256(f"{question}\x1f{i}\x1f{options[i]}".encode()).hexdigest()

    return sorted(range(len(options)), key=key)


def sciq(at: RecordAt, ctx: ConvertContext) -> QAParts:
    """SciQ (``test.json``: a list of ``{"question", "distractor1..3", "correct_answer",
    "support"}``). Choice kind: the correct answer and the three distractors in the order of
    :func:`sciq_order`; other kinds: aliases ``[correct_answer]``. Context = ``support``; ids are
    record indexes."""
    rec = at.record
    question = text_field(rec, "question") or ""
    correct = text_field(rec, "correct_answer") or ""
    parts = QAParts(
        question=question,
        aliases=[correct],
        meta_context=ctx.with_context,
        context=text_field(rec, "support", required=False),
    )
    if ctx.answer_kind == "choice":
        options = [correct] + [text_field(rec, f"distractor{i}") or "" for i in (1, 2, 3)]
        order = sciq_order(question, options)
        parts.choices = [options[i] for i in order]
        parts.answer_index = order.index(0)
    return parts


# ----------------------------------------------------------------------------- mmlu

MMLU_COLUMNS = ("question", "A", "B", "C", "D", "answer")
_MMLU_SUFFIXES = ("_test", "_dev", "_val")


def _subject(csv_path: Path) -> str:
    stem = csv_path.stem
    for suffix in _MMLU_SUFFIXES:
        if stem.endswith(suffix):
            return stem[: -len(suffix)]
    return stem


class _Prefixed:
    """A collector view that names the file in each message (a directory of CSVs)."""

    def __init__(self, collector: MalformedCollector, prefix: str) -> None:
        self.collector, self.prefix = collector, prefix

    def add(self, line: int, message: str) -> None:
        self.collector.add(line, f"{self.prefix}: {message}")


def mmlu_records(
    path: Path,
    *,
    split: str | None,
    collector: MalformedCollector,
    fmt: str,
    records_key: str | None,
) -> Iterator[RecordAt]:
    """Released MMLU: one headerless CSV (``data/test/<subject>_test.csv``: question, A, B, C,
    D, answer letter) or a directory of them (``data/test/``, or ``data/`` with ``split``
    choosing the subdirectory, default ``test``), files in name order, each row tagged with its
    ``subject`` (the file name less ``_test``/``_dev``/``_val``) and its 0-based ``row`` in that
    file. Other formats (the HF export: ``question, subject, choices, answer``) are read as they
    are, ``row`` counted per subject."""
    p = Path(path)
    is_hf_dir = (p / "state.json").is_file() or (p / "dataset_dict.json").is_file()
    if p.is_dir() and fmt in ("auto", "csv") and not is_hf_dir:
        base = p / (split or "test") if (p / (split or "test")).is_dir() else p
        files = sorted(base.glob("*.csv"))
        if not files:
            raise FileNotFoundError(f"{base}: no MMLU *.csv files")
        multi = len(files) > 1
    elif detect_format(p, fmt) == "csv":
        files, multi = [p], False
    else:
        rows: dict[str, int] = {}
        for at in iter_records(
            p, fmt=fmt, records_key=records_key, split=split, collector=collector
        ):
            subject = str(at.record.get("subject") or "")
            rows[subject] = rows.get(subject, -1) + 1
            yield at._replace(record={**at.record, "row": rows[subject]})
        return
    index = 0
    for file in files:
        sink: Any = _Prefixed(collector, file.name) if multi else collector
        subject = _subject(file)
        for at in iter_delimited(file, sink, fieldnames=MMLU_COLUMNS):
            yield RecordAt(
                at.line,
                index,
                {**at.record, "subject": subject, "row": at.index, "file": file.name},
            )
            index += 1


def mmlu(at: RecordAt, ctx: ConvertContext) -> QAParts:
    """MMLU: choices A-D, the answer letter resolved to its index (HF export: ``choices`` list
    and a 0-based ``answer``); id = ``<subject>/<row>``; meta keeps ``subject``."""
    rec = at.record
    subject = str(rec.get("subject") or "")
    where = f"{rec['file']}: " if "file" in rec and ctx.path.is_dir() else ""
    try:
        question = text_field(rec, "question") or ""
        if "choices" in rec:
            parsed = parse_choices(rec["choices"])
            if parsed is None:
                raise Bad('field "choices" must be a list of strings')
            choices = parsed[0]
        else:
            choices = [str(rec.get(c, "")).strip() for c in "ABCD"]
        key, answer = first_key(rec, "answer")
        if answer is MISSING:
            raise Bad('missing field "answer"')
        index = resolve_choice(answer, choices)
        if index is None:
            raise Bad(f"answer {answer!r} is not one of A-D (or a 0-based index)")
    except Bad as exc:
        raise Bad(where + str(exc)) from None
    return QAParts(
        question=question,
        dataset_id=f"{subject}/{rec.get('row', at.index)}",
        choices=choices,
        answer_index=index,
        aliases=[choices[index]],
        meta_extra={"subject": subject},
    )


# ----------------------------------------------------------------------------- gsm8k / svamp


def gsm8k(at: RecordAt, ctx: ConvertContext) -> QAParts:
    """GSM8K (``test.jsonl``: ``{"question", "answer": "...reasoning...\\n#### 72"}``): the
    number after ``####`` (thousands commas dropped: ``1,234`` → 1234.0); ids are record
    indexes; the solution text is not kept."""
    rec = at.record
    answer = text_field(rec, "answer") or ""
    if "####" not in answer:
        raise Bad('field "answer" has no final answer line ("#### <number>")')
    number = parse_number(answer)
    if number is None:
        raise Bad(
            f'field "answer": no number after "####" ({answer.rsplit("####", 1)[-1].strip()!r})'
        )
    return QAParts(question=text_field(rec, "question") or "", number=number)


def svamp(at: RecordAt, ctx: ConvertContext) -> QAParts:
    """SVAMP (``SVAMP.json``: a list of ``{"ID", "Body", "Question", "Equation", "Answer",
    "Type"}``): question = Body + " " + Question; number = Answer; id = ``ID``; meta keeps
    ``type`` and ``equation``."""
    rec = at.record
    body = text_field(rec, "Body", "body") or ""
    question = text_field(rec, "Question", "question") or ""
    key, answer = first_key(rec, "Answer", "answer")
    if answer is MISSING:
        raise Bad(f'missing field "{key}"')
    number = parse_number(answer)
    if number is None:
        raise Bad(f'field "{key}" must be a number, got {answer!r}')
    parts = QAParts(
        question=f"{body} {question}", dataset_id=id_field(rec, "ID", "id"), number=number
    )
    for keys, dst in ((("Type", "type"), "type"), (("Equation", "equation"), "equation")):
        value = text_field(rec, *keys, required=False)
        if value is not None:
            parts.meta_extra[dst] = value
    return parts

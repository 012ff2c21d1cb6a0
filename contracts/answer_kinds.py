"""Answer kinds and their graders: the one place that decides how an answer is graded against
its prompt's reference (rules and examples: docs/labels.md, "Answer kinds").

```python
from hallulog.contracts.answer_kinds import answer_grader, grade_answer
grade = answer_grader(group.reference)      # prepared once per prompt group; None: graded later
g = grade(text) if grade else None          # Grade(label, grader, status, span)
g = grade_answer({"kind": "numeric", "number": 18, "tolerance": 0}, "... #### 18")  # label 0
```

A reference is a dict with ``kind``:

* ``aliases`` — ``aliases: [str]`` (and ``unanswerable: true`` for SQuAD v2 questions without an
  answer): the alias-match rule of :mod:`hallulog.contracts.answer_match`, plus the matched span;
* ``choice`` — ``choices: [str]``, ``answer_index: int`` (letters A, B, ... by position);
* ``numeric`` — ``number: float``, ``tolerance: float``;
* ``judge`` — graded after the run by the LLM judge: no grader here.

A reference without ``kind`` (files written before kinds existed) is ``aliases`` when it holds a
non-empty ``aliases`` list, else it is graded later (or never), as before.
"""

from __future__ import annotations

import logging
import math
import re
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hallulog.contracts.abstention import detect_abstention
from hallulog.contracts.answer_match import (
    ARTICLE_RE,
    CORRECT,
    HALLUCINATED,
    PUNCT_TABLE,
    answer_tokens,
)

__all__ = [
    "Grade",
    "answer_kind",
    "answer_grader",
    "grade_answer",
    "token_spans",
    "parse_letter",
    "parse_choice_text",
    "parse_number",
    "KINDS",
    "ALIASES",
    "CHOICE",
    "NUMERIC",
    "JUDGE",
    "ALIAS_MATCH",
    "CHOICE_MATCH",
    "NUMERIC_MATCH",
    "GRADERS",
    "STATUSES",
    "DEFAULT_TOLERANCE",
]

log = logging.getLogger(__name__)

ALIASES, CHOICE, NUMERIC, JUDGE = "aliases", "choice", "numeric", "judge"
KINDS = (ALIASES, CHOICE, NUMERIC, JUDGE)
ALIAS_MATCH, CHOICE_MATCH, NUMERIC_MATCH = "alias_match", "choice_match", "numeric_match"
GRADERS = (ALIAS_MATCH, CHOICE_MATCH, NUMERIC_MATCH)
STATUSES = ("correct", "incorrect", "unparsed", "abstained", "no_reference", "no_answer")
"""Every ``label_status``; ``no_answer`` (label null) marks a reasoning that never closed
(``contracts/reasoning.py``): never graded."""
DEFAULT_TOLERANCE = 1e-6
"""A numeric reference's tolerance when it gives none (relative, see :func:`_numeric`)."""

Span = tuple[int, int]


@dataclass(frozen=True)
class Grade:
    """The grade of one answer by its reference's kind."""

    label: int | None
    """0 correct, 1 hallucinated, None not gradable (status ``no_reference``)."""
    grader: str
    """``alias_match``, ``choice_match`` or ``numeric_match``."""
    status: str
    """``correct`` | ``incorrect`` | ``unparsed`` (nothing to compare found in the answer:
    label 1) | ``abstained`` (an unanswerable question declined: label 0) | ``no_reference``."""
    span: Span | None = None
    """``[start, end)`` character span in the answer text of what was matched or parsed (alias
    occurrence, choice letter or text, number); None when nothing was."""


Grader = Callable[[str | None], Grade]

_warned: set[str] = set()


def answer_kind(reference: Any) -> str | None:
    """The kind of ``reference``: its ``kind``, else ``aliases`` for a dict with a non-empty
    ``aliases`` list; None for anything else (graded after the run, or not at all)."""
    if not isinstance(reference, Mapping):
        return None
    kind = reference.get("kind")
    if kind is None:
        return ALIASES if _aliases(reference) else None
    if kind in KINDS:
        return kind
    if str(kind) not in _warned:
        _warned.add(str(kind))
        log.warning(
            "reference kind %r is not one of %s: such answers are not graded",
            kind,
            ", ".join(KINDS),
        )
    return None


def answer_grader(reference: Any) -> Grader | None:
    """The grader of the answers to one prompt (the reference prepared once: aliases and choices
    normalized, the letter range fixed); None when the reference is graded after the run
    (``judge``) or there is none."""
    kind = answer_kind(reference)
    if kind == ALIASES:
        return _alias_grader(reference)
    if kind == CHOICE:
        return _choice_grader(reference)
    if kind == NUMERIC:
        return _numeric_grader(reference)
    return None


def grade_answer(reference: Any, text: str | None) -> Grade | None:
    """The grade of one answer (:func:`answer_grader` used once)."""
    grader = answer_grader(reference)
    return grader(text) if grader is not None else None


def _fixed(grade: Grade) -> Grader:
    return lambda text: grade


def _verdict(ok: bool, grader: str, span: Span | None) -> Grade:
    return (
        Grade(CORRECT, grader, "correct", span)
        if ok
        else Grade(HALLUCINATED, grader, "incorrect", span)
    )


# ---------------------------------------------------------------------------------- aliases


def _aliases(reference: Mapping[str, Any]) -> list[str]:
    aliases = reference.get("aliases")
    if isinstance(aliases, str):
        return [aliases]
    if not isinstance(aliases, (list, tuple)):
        return []
    return [str(a) for a in aliases if a is not None]


def token_spans(text: str) -> list[tuple[str, int, int]]:
    """The tokens of ``normalize_answer(text)`` (:mod:`hallulog.contracts.answer_match`), each with the
    ``[start, end)`` character span in ``text`` it comes from.

    The same steps as ``normalize_answer`` — ``_`` → space, lower-case, punctuation → space,
    articles → spaces — but every step keeps each character's position: lower-casing maps a
    character to one or more (``İ`` → ``i̇``), the lower-cased positions map back to it; an
    article becomes as many spaces as it has letters. ``[t for t, _, _ in token_spans(s)] ==
    answer_tokens(s)`` for every string (tests/contracts/test_answer_kinds.py).
    """
    spaced = text.replace("_", " ")
    lowered = spaced.lower()
    origin: list[int] | None = None
    if len(lowered) != len(spaced):  # a character lower-cased into several
        origin = [i for i, ch in enumerate(spaced) for _ in range(len(ch.lower()))]
    blank = ARTICLE_RE.sub(lambda m: " " * len(m.group()), lowered.translate(PUNCT_TABLE))
    out = []
    for m in re.finditer(r"\S+", blank):
        start, end = m.span()
        if origin is not None:
            start, end = origin[start], origin[end - 1] + 1
        out.append((m.group(), start, end))
    return out


def _first_run(tokens: list[str], needles: list[list[str]]) -> tuple[int, int] | None:
    """(token index, length) of the earliest occurrence of any needle as a run of whole tokens;
    at that index the longest needle that occurs."""
    by_first: dict[str, list[list[str]]] = {}
    for needle in needles:
        if needle:
            by_first.setdefault(needle[0], []).append(needle)
    for i, tok in enumerate(tokens):
        candidates = by_first.get(tok)
        if candidates:
            best = max((len(n) for n in candidates if tokens[i : i + len(n)] == n), default=0)
            if best:
                return i, best
    return None


def _run_span(spans: list[tuple[str, int, int]], i: int, n: int) -> Span:
    return spans[i][1], spans[i + n - 1][2]


def _alias_grader(reference: Mapping[str, Any]) -> Grader:
    if reference.get("unanswerable"):
        return _unanswerable
    aliases = _aliases(reference)
    if not aliases:
        return _fixed(Grade(None, ALIAS_MATCH, "no_reference"))
    needles = [answer_tokens(a) for a in aliases]

    def grade(text: str | None) -> Grade:
        if not text:
            return Grade(HALLUCINATED, ALIAS_MATCH, "incorrect")
        spans = token_spans(text)
        hit = _first_run([t for t, _, _ in spans], needles)
        return _verdict(
            hit is not None, ALIAS_MATCH, _run_span(spans, *hit) if hit is not None else None
        )

    return grade


def _unanswerable(text: str | None) -> Grade:
    """SQuAD v2 question without an answer: correct exactly when the answer abstains."""
    if detect_abstention(text):
        return Grade(CORRECT, ALIAS_MATCH, "abstained")
    return Grade(HALLUCINATED, ALIAS_MATCH, "incorrect")


# ----------------------------------------------------------------------------------- choice

# A letter counts at the start of the answer or after "answer is" / "answer:" (any case), when it
# stands alone: optionally in ( ) or [ ] or **bold**, followed by one of . : , ; ) ] or by the end
# of the line or text. So "B", "(B)", "B.", "B) Paris", "Answer: B", "The answer is **C**." give
# a letter; "A cat sat" and "The answer is B because" do not.
_LETTER_RE = re.compile(
    r"(?:\A\s*|(?i:\banswer(?:\s+is|\s*:))\s*:?\s*)"
    r"(?:\*\*)?[(\[]?(?:\*\*)?(?P<letter>[A-Z])(?:\*\*)?"
    r"(?=[.:,;)\]]|[ \t]*(?:\r|\n|\Z))"
)


def parse_letter(text: str, n_choices: int) -> tuple[int, Span] | None:
    """(choice index, span of the letter) of the first standalone letter among the first
    ``n_choices`` capitals at the start of ``text`` or after "answer is" / "answer:"."""
    for m in _LETTER_RE.finditer(text):
        index = ord(m.group("letter")) - ord("A")
        if index < n_choices:
            return index, m.span("letter")
    return None


def _find(tokens: list[str], needle: list[str]) -> int:
    """Index of the first occurrence of ``needle`` as a run in ``tokens``, -1 when none."""
    n = len(needle)
    for i in range(len(tokens) - n + 1):
        if tokens[i] == needle[0] and tokens[i : i + n] == needle:
            return i
    return -1


def parse_choice_text(text: str, choice_tokens: list[list[str]]) -> tuple[int, Span] | None:
    """(choice index, span) of the choice whose normalized text occurs in the normalized answer
    as whole words: the only one that does, or, when several do, the one with the most tokens if
    every other one occurs inside it; None otherwise. Choices normalizing to nothing never
    match."""
    spans = token_spans(text)
    tokens = [t for t, _, _ in spans]
    found = [
        (i, pos)
        for i, needle in enumerate(choice_tokens)
        if needle and (pos := _find(tokens, needle)) >= 0
    ]
    if not found:
        return None
    if len(found) > 1:
        longest = max(len(choice_tokens[i]) for i, _ in found)
        top = [(i, pos) for i, pos in found if len(choice_tokens[i]) == longest]
        if len(top) > 1 or any(
            _find(choice_tokens[top[0][0]], choice_tokens[i]) < 0 for i, _ in found
        ):
            return None
        found = top
    i, pos = found[0]
    return i, _run_span(spans, pos, len(choice_tokens[i]))


def _choice_grader(reference: Mapping[str, Any]) -> Grader:
    choices, index = reference.get("choices"), reference.get("answer_index")
    if (
        not isinstance(choices, (list, tuple))
        or not choices
        or not _is_int(index)
        or not 0 <= index < min(len(choices), len(string.ascii_uppercase))
    ):
        return _fixed(Grade(None, CHOICE_MATCH, "no_reference"))
    n_letters = min(len(choices), len(string.ascii_uppercase))
    choice_tokens = [answer_tokens(str(c)) if c is not None else [] for c in choices]

    def grade(text: str | None) -> Grade:
        text = text or ""
        found = parse_letter(text, n_letters) or parse_choice_text(text, choice_tokens)
        if found is None:
            return Grade(HALLUCINATED, CHOICE_MATCH, "unparsed")
        return _verdict(found[0] == index, CHOICE_MATCH, found[1])

    return grade


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# ---------------------------------------------------------------------------------- numeric

# A number: optional sign (- or U+2212) and $, then 1,234[.5] (thousands groups of 3), 3/4, 12,
# 3.50 or .5, then an optional %; not preceded by a letter, digit, _ or "." (so "H2O", "v1.2" and
# the "5" and "10" of "5-10" minus are read as nothing, nothing and 5, 10).
_NUMBER_RE = re.compile(
    r"(?<![\w.])(?P<sign>[-\u2212]?)\$?"
    r"(?:(?P<grouped>\d{1,3}(?:,\d{3})+(?:\.\d+)?)(?!\d)"
    r"|(?P<num>\d+)/(?P<den>\d+)"
    r"|(?P<plain>\d+(?:\.\d+)?|\.\d+))%?"
)


def _value(m: re.Match[str]) -> float | None:
    if m.group("den") is not None:
        den = int(m.group("den"))
        if den == 0:
            return None
        value = int(m.group("num")) / den
    else:
        value = float((m.group("grouped") or m.group("plain")).replace(",", ""))
    return -value if m.group("sign") else value


def parse_number(text: str) -> tuple[float, Span] | None:
    """(value, span) of the answer's number: the first number after the last ``####`` when the
    text has one (GSM8K's answer marker), else the last number in the text."""
    marker = text.rfind("####")
    if marker >= 0:
        for m in _NUMBER_RE.finditer(text, marker + 4):
            value = _value(m)
            if value is not None:
                return value, m.span()
        return None
    last = None
    for m in _NUMBER_RE.finditer(text):
        value = _value(m)
        if value is not None:
            last = value, m.span()
    return last


def _as_float(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _numeric_grader(reference: Mapping[str, Any]) -> Grader:
    number = _as_float(reference.get("number"))
    tolerance = reference.get("tolerance")
    tolerance = DEFAULT_TOLERANCE if tolerance is None else _as_float(tolerance)
    if number is None or tolerance is None or tolerance < 0:
        return _fixed(Grade(None, NUMERIC_MATCH, "no_reference"))
    limit = tolerance * max(1.0, abs(number))

    def grade(text: str | None) -> Grade:
        found = parse_number(text or "")
        if found is None:
            return Grade(HALLUCINATED, NUMERIC_MATCH, "unparsed")
        return _verdict(abs(found[0] - number) <= limit, NUMERIC_MATCH, found[1])

    return grade

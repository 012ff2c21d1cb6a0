"""What a grader returns (:class:`Verdict`), the :class:`Grader` interface, and the helpers
every grader shares (reading a prompt row's question and reference; abstention phrases).

The rules of every grader: docs/labels.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Verdict", "Grader", "ALIAS_GRADER", "JUDGE_GRADER", "JUDGE_TASKS",
           "ABSTENTION_PHRASES", "detect_abstention", "question_of", "reference_of"]

ALIAS_GRADER = "alias_match"
JUDGE_GRADER = "llm_judge"
JUDGE_TASKS = ("precisewikiqa", "longwiki", "mixedentities")


@dataclass(frozen=True)
class Verdict:
    """The grade of one answer."""

    label: int | None
    """0 correct, 1 hallucinated, None could not be graded (see ``verdict``)."""
    grader: str
    """``alias_match`` or ``llm_judge``."""
    verdict: str
    """correct | incorrect | unverifiable | abstained | no_claims | real_entity_treated_as_real |
    fake_entity_treated_as_real | no_reference | unparseable | judge_rejected (docs/labels.md)."""
    abstained: bool
    raw: str | None = None
    """The judge's raw text (several steps: ``[step] text`` blocks); None for alias match."""
    details: dict[str, Any] | None = None
    """Grader-specific extras (longwiki claim counts, which steps ran)."""


class Grader(Protocol):
    name: str
    judge_model: str | None

    async def grade(self, prompt_row: dict, answer: str) -> Verdict: ...

    async def aclose(self) -> None: ...


# Phrases that mark an answer as an abstention (matched case-insensitively, as whole words, after
# curly apostrophes become straight ones and whitespace collapses). Kept short and specific: a
# phrase must signal "I decline / do not know", never appear inside an ordinary factual answer.
ABSTENTION_PHRASES: tuple[str, ...] = (
    "i don't know", "i do not know", "i dont know",
    "i'm not sure", "i am not sure", "i'm not certain", "i am not certain",
    "i cannot answer", "i can't answer", "i can not answer", "cannot answer that",
    "unable to answer", "i'm unable to", "i am unable to",
    "i don't have enough information", "i do not have enough information",
    "i don't have information", "i do not have information",
    "i don't have any information", "i do not have any information",
    "i couldn't find", "i could not find", "i can't find", "i cannot find",
    "i'm not aware of", "i am not aware of", "i have no information", "i have no knowledge",
    "no information available", "i'm not familiar with", "i am not familiar with",
    "i cannot provide", "i can't provide", "i don't have access to", "i do not have access to",
    "i can't verify", "i cannot verify",
)

_ABSTENTION_RE = re.compile(
    r"(?<![\w'])(?:" + "|".join(re.escape(p) for p in ABSTENTION_PHRASES) + r")(?![\w'])")
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u00b4": "'", "`": "'"})


def detect_abstention(text: str | None) -> bool:
    """True when ``text`` contains one of :data:`ABSTENTION_PHRASES` (or is blank)."""
    if text is None or not text.strip():
        return True
    norm = " ".join(text.translate(_APOSTROPHES).lower().split())
    return _ABSTENTION_RE.search(norm) is not None


def question_of(row: dict) -> str:
    """The question of a ``prompt_index.jsonl`` row (its meta's, else the prompt text)."""
    meta = row.get("meta") or {}
    return str(meta.get("question") or row.get("prompt") or "")


def reference_of(row: dict) -> dict[str, Any]:
    """The reference of a ``prompt_index.jsonl`` row as a dict (``value``, ``aliases``…)."""
    ref = row.get("reference")
    if isinstance(ref, dict):
        return ref
    if ref is None:
        value = row.get("reference_answer")
        return {"value": value} if value is not None else {}
    return {"value": ref}

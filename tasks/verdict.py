"""What a grader returns (:class:`Verdict`), the :class:`Grader` interface, and the helpers
every grader shares (reading a prompt row's question and reference; the abstention phrases,
re-exported from :mod:`hallulog.contracts.abstention`).

The rules of every grader: docs/labels.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from hallulog.contracts.abstention import ABSTENTION_PHRASES, detect_abstention

__all__ = [
    "Verdict",
    "Grader",
    "ALIAS_GRADER",
    "JUDGE_GRADER",
    "JUDGE_TASKS",
    "ABSTENTION_PHRASES",
    "detect_abstention",
    "question_of",
    "reference_of",
]

ALIAS_GRADER = "alias_match"
JUDGE_GRADER = "llm_judge"
JUDGE_TASKS = ("precisewikiqa", "longwiki", "mixedentities")


@dataclass(frozen=True)
class Verdict:
    """The grade of one answer."""

    label: int | None
    """0 correct, 1 hallucinated, None could not be graded (see ``verdict``)."""
    grader: str
    """``alias_match``, ``choice_match``, ``numeric_match`` (hallulog.contracts.answer_kinds) or
    ``llm_judge``."""
    verdict: str
    """correct | incorrect | unparsed | unverifiable | abstained | no_claims |
    real_entity_treated_as_real | fake_entity_treated_as_real | no_reference | unparseable |
    judge_rejected (docs/labels.md)."""
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

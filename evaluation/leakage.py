"""Leakage: the reference answer is in what the model was given.

PARALLAX (Hussain & Kantarcioglu, 2026) shows that benchmarks which put the answer into the
prompt (a HaluEval-style context passage) let a plain text-similarity score match the best
detectors. A prompt is **leaked** when some accepted answer, normalised as the alias grader
normalises (``hallulog.contracts.answer_match``: lower case, punctuation and the articles a/an/the
removed, whitespace collapsed), occurs as a run of whole words in the normalised text the model
was given: the prompt text and every message's content (system prompt, few-shot examples, the
question and, with ``--with-context``, the context passage).

The accepted answers are the reference's aliases (kind ``aliases``, not for unanswerable
questions) or its value and aliases (kind ``judge``, or a reference without kind; a row with
only ``reference_answer``: that text). Multiple-
choice references list every choice in the prompt by construction and numeric ones are numbers,
so prompts of kind ``choice`` and ``numeric`` are not checked (``checked`` false).

``source`` says where the answer was found first: ``question`` (``meta.question``), ``context``
(``meta.context``) or ``prompt`` (elsewhere: the template, the system prompt, a few-shot
example).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hallulog.contracts.answer_match import answer_tokens

__all__ = ["Leak", "accepted_answers", "find_leak"]


@dataclass(frozen=True)
class Leak:
    checked: bool  # the reference has answers to look for
    leaked: bool
    source: str | None = None  # question | context | prompt


def accepted_answers(reference: Any) -> list[str]:
    """The answers a leak is looked for (empty: not checked)."""
    if not isinstance(reference, Mapping):
        return [reference] if isinstance(reference, str) and reference else []
    kind = reference.get("kind")
    if kind in ("choice", "numeric") or reference.get("unanswerable"):
        return []
    out = []
    if kind in (None, "judge") and reference.get("value"):
        out.append(str(reference["value"]))
    aliases = reference.get("aliases")
    if isinstance(aliases, str):
        aliases = [aliases]
    out.extend(str(a) for a in aliases or [] if a is not None)
    return out


def _contains(haystack: list[str], needle: list[str]) -> bool:
    n = len(needle)
    return any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "\n\n".join(_text(v) for v in value)
    return "" if value is None else str(value)


def find_leak(prompt_row: Mapping[str, Any]) -> Leak:
    """Whether a prompt_index row's reference answer is in what its model was given."""
    ref = prompt_row.get("reference")
    answers = accepted_answers(ref if ref is not None else prompt_row.get("reference_answer"))
    needles = [t for t in (answer_tokens(a) for a in answers) if t]
    if not needles:
        return Leak(checked=False, leaked=False)
    given = [_text(prompt_row.get("prompt"))]
    given += [
        _text(m.get("content")) for m in prompt_row.get("messages") or [] if isinstance(m, Mapping)
    ]
    seen = answer_tokens("\n".join(given))
    if not any(_contains(seen, n) for n in needles):
        return Leak(checked=True, leaked=False)
    meta = prompt_row.get("meta") or {}
    for source in ("question", "context"):
        part = answer_tokens(_text(meta.get(source)))
        if any(_contains(part, n) for n in needles):
            return Leak(checked=True, leaked=True, source=source)
    return Leak(checked=True, leaked=True, source="prompt")

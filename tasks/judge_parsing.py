"""Parsing the LLM judge's constrained answers (keywords, longwiki claim lists)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from hallulog.tasks import judge_prompts as jp

__all__ = ["parse_choice", "parse_longwiki"]


def _keyword_re(choices: Iterable[str]) -> re.Pattern[str]:
    # A keyword matches as a whole word, with "_" and spaces interchangeable (NO_CLAIMS, NO CLAIMS).
    alts = sorted({c.upper() for c in choices}, key=len, reverse=True)
    parts = [r"[\s_]+".join(map(re.escape, a.split("_"))) for a in alts]
    return re.compile(r"(?<![A-Za-z0-9])(" + "|".join(parts) + r")(?![A-Za-z0-9])", re.IGNORECASE)


def _canon(word: str) -> str:
    return re.sub(r"[\s_]+", "_", word.strip().upper())


def parse_choice(text: str | None, choices: Iterable[str]) -> str | None:
    """The keyword of a constrained judge answer, or None when there is none or it is ambiguous.

    Rule: the earliest whole-word, case-insensitive occurrence of any keyword in ``choices`` wins
    ("Grade: **correct**." → CORRECT; INCORRECT never matches CORRECT). Exception: when the first
    line holding a keyword holds two or more *different* keywords (the judge echoed the option
    list, "CORRECT, INCORRECT or UNVERIFIABLE"), the answer is ambiguous → None.
    """
    if not text:
        return None
    choices = tuple(choices)
    pattern = _keyword_re(choices)
    for line in text.splitlines():
        found = [_canon(m.group(1)) for m in pattern.finditer(line)]
        if not found:
            continue
        if len(set(found)) > 1:
            return None
        return found[0]
    return None


# "CLAIM: ...", "1. CLAIM 1: ...", "- **Claim**: ..." (list markers and numbering allowed)
_CLAIM_LINE = re.compile(r"^[\W\d]*claim\s*\d*\W*[:.)\-]", re.IGNORECASE)
_VERDICT_LINE = re.compile(r"^[\W\d]*verdict\b", re.IGNORECASE)


def parse_longwiki(text: str | None) -> dict[str, Any] | None:
    """Claim counts and the response-level decision of a longwiki judge answer.

    Lines starting with ``CLAIM`` count when they hold exactly one distinct keyword of
    SUPPORTED / CONTRADICTED / UNSUPPORTED (lines echoing the option list are skipped). The
    decision comes from the claims when there are any (any CONTRADICTED or UNSUPPORTED claim →
    HALLUCINATED, else FAITHFUL) — the claims define the label, a ``VERDICT:`` line that disagrees
    with them is overruled; with no countable claim the ``VERDICT:`` line decides (only NO_CLAIMS
    is accepted there without claims). Returns None when neither gives an answer.
    """
    if not text:
        return None
    counts = {jp.SUPPORTED: 0, jp.CONTRADICTED: 0, jp.UNSUPPORTED: 0}
    claim_re = _keyword_re(jp.CLAIM_CHOICES)
    verdict_line: str | None = None
    for line in text.splitlines():
        if _CLAIM_LINE.match(line):
            found = {_canon(m.group(1)) for m in claim_re.finditer(line)}
            if len(found) == 1:
                counts[found.pop()] += 1
        elif verdict_line is None and _VERDICT_LINE.match(line):
            verdict_line = parse_choice(line, jp.LONGWIKI_VERDICT_CHOICES)
    n = sum(counts.values())
    if n:
        bad = counts[jp.CONTRADICTED] + counts[jp.UNSUPPORTED]
        decision = jp.HALLUCINATED if bad else jp.FAITHFUL
    elif verdict_line == jp.NO_CLAIMS:
        decision = jp.NO_CLAIMS
    else:
        return None
    return {
        "decision": decision,
        "verdict_line": verdict_line,
        "claims": n,
        "supported": counts[jp.SUPPORTED],
        "contradicted": counts[jp.CONTRADICTED],
        "unsupported": counts[jp.UNSUPPORTED],
    }

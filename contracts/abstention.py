"""Abstention phrases: does an answer decline to answer? (docs/labels.md).

Shared by the worker-side graders (:mod:`hallulog.contracts.answer_kinds`: SQuAD v2 unanswerable
questions) and the post-run alias grader (``hallulog.tasks.triviaqa.AliasGrader``: the
``abstained`` flag).
"""

from __future__ import annotations

import re

__all__ = ["ABSTENTION_PHRASES", "detect_abstention"]

# Phrases that mark an answer as an abstention (matched case-insensitively, as whole words, after
# curly apostrophes become straight ones and whitespace collapses). Kept short and specific: a
# phrase must signal "I decline / do not know", never appear inside an ordinary factual answer.
ABSTENTION_PHRASES: tuple[str, ...] = (
    "i don't know",
    "i do not know",
    "i dont know",
    "i'm not sure",
    "i am not sure",
    "i'm not certain",
    "i am not certain",
    "i cannot answer",
    "i can't answer",
    "i can not answer",
    "cannot answer that",
    "unable to answer",
    "i'm unable to",
    "i am unable to",
    "i don't have enough information",
    "i do not have enough information",
    "i don't have information",
    "i do not have information",
    "i don't have any information",
    "i do not have any information",
    "i couldn't find",
    "i could not find",
    "i can't find",
    "i cannot find",
    "i'm not aware of",
    "i am not aware of",
    "i have no information",
    "i have no knowledge",
    "no information available",
    "i'm not familiar with",
    "i am not familiar with",
    "i cannot provide",
    "i can't provide",
    "i don't have access to",
    "i do not have access to",
    "i can't verify",
    "i cannot verify",
)

_ABSTENTION_RE = re.compile(
    r"(?<![\w'])(?:" + "|".join(re.escape(p) for p in ABSTENTION_PHRASES) + r")(?![\w'])"
)
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u00b4": "'", "`": "'"})


def detect_abstention(text: str | None) -> bool:
    """True when ``text`` contains one of :data:`ABSTENTION_PHRASES` (or is blank)."""
    if text is None or not text.strip():
        return True
    norm = " ".join(text.translate(_APOSTROPHES).lower().split())
    return _ABSTENTION_RE.search(norm) is not None

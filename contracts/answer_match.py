"""Answer normalization and the alias-match grader (triviaqa).

The rule (documented in docs/tasks.md):

* Both the model's answer and every reference alias go through :func:`normalize_answer`, which
  has the semantics of the official TriviaQA evaluation script: ``_`` becomes a space, text is
  lower-cased, every ASCII punctuation character and the quote marks ``‘ ’ ´ ``` become a space,
  the articles *a*, *an*, *the* are removed as whole words, and runs of whitespace collapse to one
  space (stripped at both ends).
* The answer is **correct (label 0)** when the token sequence of some normalized alias occurs as
  a contiguous run of whole tokens inside the token sequence of the normalized answer; otherwise
  it is **hallucinated (label 1)**. A blank answer (nothing left after normalization) is 1;
  aliases that normalize to nothing are ignored.

So ``"It is Paris, France."`` matches the alias ``Paris``, but ``"Parisian"`` does not, and
``"1066"`` does not match an alias ``"106"``.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterable

__all__ = [
    "normalize_answer",
    "alias_match_label",
    "alias_matcher",
    "answer_tokens",
    "CORRECT",
    "HALLUCINATED",
    "PUNCT_TABLE",
    "ARTICLE_RE",
]

CORRECT = 0
HALLUCINATED = 1

_PUNCT = frozenset(string.punctuation) | {"\u2018", "\u2019", "\u00b4", "`"}
PUNCT_TABLE = {ord(ch): " " for ch in _PUNCT}
"""``str.translate`` table: every punctuation character (ASCII and curly quotes) → a space."""
ARTICLE_RE = re.compile(r"\b(?:a|an|the)\b")
"""The articles ``normalize_answer`` removes (on lower-cased text)."""


def normalize_answer(text: str) -> str:
    """Normalize like the official TriviaQA evaluation (own implementation).

    Steps, in order: ``_`` → space; lower-case; punctuation → space; drop the articles a/an/the
    (whole words); collapse whitespace.
    """
    text = text.replace("_", " ").lower()
    text = text.translate(PUNCT_TABLE)
    text = ARTICLE_RE.sub(" ", text)
    return " ".join(text.split())


def answer_tokens(text: str) -> list[str]:
    """Whitespace tokens of the normalized text."""
    return normalize_answer(text).split()


def _contains_run(haystack: list[str], needle: list[str]) -> bool:
    n = len(needle)
    if n == 0 or n > len(haystack):
        return False
    first = needle[0]
    for i in range(len(haystack) - n + 1):
        if haystack[i] == first and haystack[i : i + n] == needle:
            return True
    return False


def alias_match_label(answer_text: str | None, aliases: Iterable[str]) -> int:
    """0 (correct) when a normalized alias occurs in the normalized answer as whole words, else 1.

    A blank or missing answer is 1 (hallucinated); aliases that normalize to the empty string are
    skipped (they would otherwise match everything).
    """
    return alias_matcher(aliases)(answer_text)


def alias_matcher(aliases: Iterable[str]) -> Callable[[str | None], int]:
    """:func:`alias_match_label` with ``aliases`` normalized once, for grading many answers."""
    needles = [answer_tokens(str(alias)) for alias in aliases if alias is not None]

    def label(answer_text: str | None) -> int:
        if not answer_text:
            return HALLUCINATED
        tokens = answer_tokens(answer_text)
        if tokens and any(_contains_run(tokens, needle) for needle in needles):
            return CORRECT
        return HALLUCINATED

    return label

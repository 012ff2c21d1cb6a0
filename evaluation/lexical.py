"""ROUGE-1 / ROUGE-2 / ROUGE-L F-measures between two answers, as Google's ``rouge-score``
package computes them with ``use_stemmer=True`` (what LM-Polygraph's LexicalSimilarity calls).

Tokens: lower case, every run of characters outside ``[a-z0-9]`` is a separator, words longer
than 3 characters are Porter-stemmed (NLTK's ``PorterStemmer``). ROUGE-n: clipped n-gram
overlap, P = overlap / n-grams of the second text, R = overlap / n-grams of the first, F =
2PR / (P + R) (0 when P + R = 0); ROUGE-L: the same with the longest common subsequence.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache

__all__ = ["rouge_tokens", "rouge_f"]

_SEP = re.compile(r"[^a-z0-9]+")
_VALID = re.compile(r"^[a-z0-9]+$")


@lru_cache(maxsize=1)
def _stemmer():
    from nltk.stem import porter

    return porter.PorterStemmer()


@lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    return _stemmer().stem(word)


@lru_cache(maxsize=16384)
def rouge_tokens(text: str) -> tuple[str, ...]:
    words = re.split(r"\s+", _SEP.sub(" ", (text or "").lower()))
    words = [_stem(w) if len(w) > 3 else w for w in words]
    return tuple(w for w in words if _VALID.match(w))


def _f(overlap: int, n_first: int, n_second: int) -> float:
    p = overlap / max(n_second, 1)
    r = overlap / max(n_first, 1)
    return 2 * p * r / (p + r) if p + r > 0 else 0.0


def _lcs(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b, start=1):
            cur.append(prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1]))
        prev = cur
    return prev[-1]


def rouge_f(first: str, second: str, metric: str) -> float:
    """F-measure of ``metric`` (``rouge1``, ``rouge2`` or ``rougeL``) of ``second`` against
    ``first`` (symmetric for F)."""
    a, b = rouge_tokens(first), rouge_tokens(second)
    if metric == "rougeL":
        if not a or not b:
            return 0.0
        lcs = _lcs(a, b)
        return _f(lcs, len(a), len(b))
    n = {"rouge1": 1, "rouge2": 2}[metric]
    ga = Counter(a[i : i + n] for i in range(len(a) - n + 1))
    gb = Counter(b[i : i + n] for i in range(len(b) - n + 1))
    overlap = sum(min(c, gb[g]) for g, c in ga.items())
    return _f(overlap, sum(ga.values()), sum(gb.values()))

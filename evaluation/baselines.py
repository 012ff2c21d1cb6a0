"""LLMs-Know-More logprob baselines (Orgad et al., 2024) on the primary answer's tokens.

Every score is oriented "higher = more likely hallucinated", so the logprob aggregates are
negated. Definitions: docs/evaluation.md.
"""

from __future__ import annotations

import math
import re

__all__ = ["LOGPROB_METHODS", "logprob_scores", "exact_answer_index"]

LOGPROB_METHODS = ("logprob_min", "logprob_mean", "logprob_sum", "logprob_last", "perplexity")


def logprob_scores(token_logprobs: list[float]) -> dict[str, float]:
    """Negated min / mean / sum / last-token logprob and perplexity of one answer."""
    lps = [float(x) for x in token_logprobs or [] if x is not None]
    if not lps:
        return dict.fromkeys(LOGPROB_METHODS, float("nan"))
    mean = sum(lps) / len(lps)
    return {
        "logprob_min": -min(lps),
        "logprob_mean": -mean,
        "logprob_sum": -sum(lps),
        "logprob_last": -lps[-1],
        "perplexity": math.exp(min(-mean, 700.0)),
    }


_SPECIAL = re.compile(r"^<\|.*\|>$|^</?s>$")
_ALNUM = re.compile(r"\w", re.UNICODE)


def exact_answer_index(tokens: list[str]) -> int | None:
    """Index of the last token of the exact answer in the generated tokens, or None.

    Orgad et al. extract the exact answer with an LLM and probe its last token. Our answers are
    short, so the exact answer is taken as the first line / first sentence of the answer: the
    last token holding a letter or digit before the first newline or sentence end (no reference
    answer is used, so the position does not leak the label).
    """
    last = None
    for i, tok in enumerate(tokens or []):
        if tok is None or _SPECIAL.match(tok.strip()):
            break
        text = tok.replace("\u010a", "\n").replace("\u0120", " ")
        if "\n" in text:
            if _ALNUM.search(text.split("\n")[0]):
                last = i
            if last is not None:
                break
            continue
        if _ALNUM.search(text):
            last = i
        if last is not None and text.rstrip().endswith((".", "!", "?")):
            break
    return last

"""The exact answer of a response as a token span: what the ``exact_answer`` position stores.

```python
from hallulog.contracts.exact_answer import exact_answer_span
span = exact_answer_span("Paris.", ["Par", "is", "."], grader_span=(0, 5))
# {"chars": [0, 5], "tokens": [0, 2], "source": "grader"}
```

Two rules, in order (docs/alignment.md, "Exact answer"):

1. ``grader``: the grader's match in the response (``answer_span`` of the generation row: the
   alias occurrence, choice letter or number), when there is one and the token texts
   concatenate to the response text (trailing tokens that add no text, such as an end-of-
   sequence token rendered empty, are allowed);
2. ``first_line``: otherwise the first non-empty line of the response, stripped of whitespace,
   of a leading ``Answer:`` and of trailing punctuation (``. , ; : ! ?`` and ``…``). When the
   token texts do not concatenate to the response text, the rule is applied to their
   concatenation instead, whose characters then are the ones ``chars`` counts.

Characters map to tokens by the tokens' cumulative text lengths: token i covers characters
``[c_i, c_i + len(token_i))``; every token overlapping the character span is in the token span.
No span (None) when the rule finds nothing (an empty response, a line of punctuation only).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["exact_answer_span", "first_line_span", "char_to_token_span", "GRADER", "FIRST_LINE"]

GRADER, FIRST_LINE = "grader", "first_line"

_ANSWER_PREFIX = re.compile(r"^answer\s*:\s*", re.IGNORECASE)
_TRAILING = ".,;:!?…"


def first_line_span(text: str) -> tuple[int, int] | None:
    """``[start, end)`` of the first non-empty line of ``text``, stripped of whitespace, of a
    leading ``Answer:`` and of trailing punctuation; None when nothing is left."""
    offset = 0
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        start = offset + len(body) - len(body.lstrip())
        offset += len(line)
        answer = body.strip()
        prefix = _ANSWER_PREFIX.match(answer)
        if prefix:
            start += prefix.end()
            answer = answer[prefix.end() :]
        end = start + len(answer.rstrip(_TRAILING + " \t\f\v"))
        if end > start:
            return start, end
    return None


def char_to_token_span(token_texts: Sequence[str], span: tuple[int, int]) -> tuple[int, int] | None:
    """``[s, e)`` of the tokens overlapping the character span ``[start, end)`` of the tokens'
    concatenation; None when no token does."""
    start, end = int(span[0]), int(span[1])
    first = last = None
    pos = 0
    for i, tok in enumerate(token_texts):
        nxt = pos + len(tok)
        if pos < end and nxt > start and nxt > pos:
            if first is None:
                first = i
            last = i
        pos = nxt
        if pos >= end:
            break
    return None if first is None else (first, last + 1)


def exact_answer_span(
    text: str, token_texts: Sequence[str | None], grader_span: Sequence[int] | None
) -> dict | None:
    """``{"chars": [a, b], "tokens": [s, e], "source": "grader" | "first_line"}`` or None.

    ``token_texts`` are the response's token strings in order (the logprobs' ``token``);
    ``grader_span`` the grader's ``[start, end)`` in ``text`` or None.
    """
    tokens = ["" if t is None else str(t) for t in token_texts]
    joined = "".join(tokens)
    aligned = joined == text or (joined.startswith(text) and _empty_tail(tokens, len(text)))
    if aligned and grader_span is not None and 0 <= grader_span[0] < grader_span[1] <= len(text):
        span = (int(grader_span[0]), int(grader_span[1]))
        tok = char_to_token_span(tokens, span)
        if tok is not None:
            return {"chars": list(span), "tokens": list(tok), "source": GRADER}
    source = text if aligned else joined
    span = first_line_span(source)
    if span is None:
        return None
    tok = char_to_token_span(tokens, span)
    if tok is None:
        return None
    return {"chars": list(span), "tokens": list(tok), "source": FIRST_LINE}


def _empty_tail(tokens: list[str], length: int) -> bool:
    """The tokens past the first ``length`` characters hold no visible text (e.g. an end token
    a backend renders as its special string while the response text leaves it out)."""
    pos = 0
    for i, tok in enumerate(tokens):
        if pos >= length:
            return all(_special(t) for t in tokens[i:])
        pos += len(tok)
    return True


_SPECIAL = re.compile(r"^(<\|[^|]*\|>|</?s>|<eos>|<pad>)$")


def _special(token: str) -> bool:
    return token == "" or bool(_SPECIAL.match(token))

"""Reasoning kept apart from the answer: where a reasoning model's answer starts in its tokens.

```python
from hallulog.contracts.reasoning import ReasoningMarkers, split_reasoning, answer_view
markers = ReasoningMarkers(start_id=49152, end_id=49153)
split = split_reasoning(prompt_ids, token_ids, markers)
split.reasoning      # (s, e): the reasoning tokens [s, e) of token_ids
split.answer_start   # e + 1 (the token after the end marker), or None: never closed (no_answer)
answer_view(row)     # a generation row sliced to its answer (text, logprobs, token_ids)
```

The rule (docs/reasoning.md, "How the split is made"), on token ids only:

- a generation reasons when its prompt leaves the reasoning open (the last start marker of the
  prompt comes after its last end marker: the chat template wrote ``<think>``) or when its
  first generated token is the start marker (the model opened it); otherwise it is not split
  (None), e.g. ``--thinking off`` whose template closed an empty block;
- the reasoning is the generated tokens from ``s`` (0, or 1 past an opening start marker) up
  to the first end marker at or after ``s`` (exclusive); the answer starts at the token after
  that end marker; with no end marker the reasoning runs to the last token and there is no
  answer (``answer_start`` None: the row's ``label_status`` is ``no_answer``).

Only :mod:`contracts` may be imported here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "NO_ANSWER",
    "ReasoningMarkers",
    "ReasoningSplit",
    "split_reasoning",
    "reasoning_open",
    "is_no_answer",
    "answer_start",
    "answer_view",
    "markers_from_vocab",
    "THINK_TOKENS",
]

THINK_TOKENS = ("<think>", "</think>")
"""The reasoning markers looked for in a tokenizer's added tokens (Qwen3, DeepSeek-R1)."""

NO_ANSWER = "no_answer"
"""``label_status`` of a generation whose reasoning never closed: never graded."""


@dataclass(frozen=True)
class ReasoningMarkers:
    """The token ids that open and close a model's reasoning (``<think>``, ``</think>``)."""

    start_id: int
    end_id: int


@dataclass(frozen=True)
class ReasoningSplit:
    """One generation's reasoning span and where its answer starts."""

    reasoning: tuple[int, int]
    """``[s, e)``: the reasoning tokens of the generated token ids (markers excluded)."""
    answer_start: int | None
    """Index of the first answer token (``e + 1``); None when the reasoning never closed."""


def markers_from_vocab(added_vocab: Mapping[str, int]) -> ReasoningMarkers | None:
    """The markers of a tokenizer whose added tokens (``tokenizer.get_added_vocab()``) hold
    ``<think>`` and ``</think>`` as single tokens; None otherwise."""
    start, end = (added_vocab.get(t) for t in THINK_TOKENS)
    if start is None or end is None:
        return None
    return ReasoningMarkers(start_id=int(start), end_id=int(end))


def reasoning_open(prompt_ids: Sequence[int], markers: ReasoningMarkers) -> bool:
    """Whether the prompt leaves the reasoning open (its last start marker follows its last
    end marker)."""
    last_start = last_end = -1
    for i, tok in enumerate(prompt_ids):
        if tok == markers.start_id:
            last_start = i
        elif tok == markers.end_id:
            last_end = i
    return last_start > last_end


def split_reasoning(
    prompt_ids: Sequence[int], token_ids: Sequence[int], markers: ReasoningMarkers | None
) -> ReasoningSplit | None:
    """The split of one generation (module docstring); None when it does not reason."""
    if markers is None:
        return None
    opened = bool(token_ids) and token_ids[0] == markers.start_id
    if not opened and not reasoning_open(prompt_ids, markers):
        return None
    s = 1 if opened else 0
    for i in range(s, len(token_ids)):
        if token_ids[i] == markers.end_id:
            return ReasoningSplit(reasoning=(s, i), answer_start=i + 1)
    return ReasoningSplit(reasoning=(s, len(token_ids)), answer_start=None)


def is_no_answer(row: Mapping[str, Any]) -> bool:
    """A generation row whose reasoning never closed (no answer to grade or score)."""
    return row.get("label_status") == NO_ANSWER


def answer_start(row: Mapping[str, Any]) -> int:
    """Index of a generation row's first answer token: ``answer_token_start``, 0 for a row
    without reasoning, the token count for a ``no_answer`` row (its answer is empty)."""
    if "reasoning_span" not in row:
        return 0
    start = row.get("answer_token_start")
    return len(row.get("token_ids") or []) if start is None else int(start)


def answer_view(row: Mapping[str, Any]) -> Mapping[str, Any]:
    """``row`` sliced to its answer: ``logprobs`` and ``token_ids`` from the first answer
    token on (``text`` already is the answer). A row without reasoning is returned as it is.

    Every reader that scores or exports answers (logprob and sample-consistency detectors,
    method exports) goes through this one function.
    """
    start = answer_start(row)
    if "reasoning_span" not in row:
        return row
    return {
        **row,
        "logprobs": list(row.get("logprobs") or [])[start:],
        "token_ids": list(row.get("token_ids") or [])[start:],
    }

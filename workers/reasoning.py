"""A reasoning generation split into its reasoning and its answer, checked against the server.

The split itself is the token rule of :mod:`hallulog.contracts.reasoning` on the generated
token ids; the texts come from the server: ``message.reasoning`` and ``message.content`` when
it splits them (the embedded server, vLLM with ``--reasoning-parser``), else the reply's text
cut at the end marker's text (vLLM without a parser). What the server hands back must agree
with the token ids: an answer iff the end marker is among them, no reasoning text for a
generation that does not reason. A disagreement raises :class:`ReasoningMismatch` (the group
fails with ``reasoning_mismatch`` in ``errors.jsonl``) rather than storing a wrong split.
"""

from __future__ import annotations

from typing import Any

from hallulog.contracts.errors import HallulogError
from hallulog.contracts.reasoning import (
    NO_ANSWER,
    THINK_TOKENS,
    ReasoningMarkers,
    ReasoningSplit,
    split_reasoning,
)

__all__ = [
    "ReasoningMismatch",
    "split_completion",
    "split_all",
    "answer_starts",
    "reasoning_fields",
    "NO_ANSWER",
]


class ReasoningMismatch(HallulogError, ValueError):
    """The server's reasoning/answer texts disagree with the generated token ids."""


def split_completion(comp: Any, markers: ReasoningMarkers | None) -> ReasoningSplit | None:
    """Split ``comp`` (a :class:`~hallulog.workers.client.Completion`) in place: ``text``
    becomes the answer ("" when the reasoning never closed), ``reasoning`` the reasoning text.
    None (and ``comp`` untouched) for a generation that does not reason."""
    split = split_reasoning(comp.prompt_token_ids, comp.token_ids, markers)
    content = comp.text
    if split is None:
        if comp.reasoning:
            raise ReasoningMismatch(
                "the server returned reasoning text for a generation whose token ids hold no "
                "open reasoning"
            )
        comp.reasoning = None
        return None
    closed = split.answer_start is not None
    if comp.reasoning is None and THINK_TOKENS[1] in content:  # the server did not split
        before, _, answer = content.partition(THINK_TOKENS[1])
        comp.reasoning = before.removeprefix(THINK_TOKENS[0])
        content = answer
    elif comp.reasoning is None and not closed:
        comp.reasoning, content = content, ""
    if closed and comp.reasoning is None and split.reasoning[0] != split.reasoning[1]:
        raise ReasoningMismatch(
            "the end-of-reasoning token is among the generated ids but the server's text does "
            "not close the reasoning"
        )
    if not closed and content:
        raise ReasoningMismatch(
            f"the server returned an answer ({content[:60]!r}) for a generation whose "
            "reasoning never closed (no end-of-reasoning token among its ids)"
        )
    comp.reasoning = comp.reasoning or ""
    comp.text = content
    comp.split = split
    return split


def split_all(completions: list[Any], markers: ReasoningMarkers | None) -> None:
    """:func:`split_completion` of each of a group's completions (nothing without markers)."""
    if markers is not None:
        for comp in completions:
            split_completion(comp, markers)


def answer_starts(completions: list[Any]) -> list[int | None]:
    """Each completion's first answer token: 0 without reasoning, None without an answer."""
    return [0 if c.split is None else c.split.answer_start for c in completions]


def reasoning_fields(comp: Any) -> dict[str, Any]:
    """The generation row's reasoning fields (docs/formats/worker-jsonl.md); none for a
    generation that does not reason, so such rows are as they were. A reasoning that never
    closed also sets ``label_status`` to ``no_answer`` (its label stays null)."""
    split = comp.split
    if split is None:
        return {}
    out = {
        "reasoning": comp.reasoning,
        "reasoning_span": list(split.reasoning),
        "answer_token_start": split.answer_start,
    }
    if split.answer_start is None:
        out["label_status"] = NO_ANSWER
    return out

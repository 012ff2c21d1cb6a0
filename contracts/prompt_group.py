"""The unit of work: one question turned into a prompt group (primary + K samples)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hallulog.contracts.ids import prompt_id_for

__all__ = ["PromptGroup"]


@dataclass(frozen=True)
class PromptGroup:
    """One question of a task, ready to send to a backend.

    Plain data only: it crosses process boundaries through the in-memory queue (pickled).
    """

    prompt_id: str
    """First 16 hex of sha256 of ``[dataset, split, dataset_index]`` (see ``hallulog.contracts.ids``)."""
    dataset: str
    """Task name: triviaqa, precisewikiqa, longwiki, mixedentities."""
    split: str
    dataset_id: str
    """The item's index or identifier as the dataset gives it, stringified."""
    messages: list[dict[str, str]]
    """Chat messages sent to ``/v1/chat/completions`` (empty when ``prompt`` is set)."""
    reference: Any = None
    """What the grader compares against: for triviaqa a dict with ``value`` and ``aliases``."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Dataset-specific fields kept in ``prompt_index.jsonl`` (question_type, entity_type, ...)."""
    prompt: str | None = None
    """Raw text sent to ``/v1/completions`` when the study turns the chat template off
    (``--chat false``); ``messages`` is then empty."""

    @classmethod
    def create(
        cls,
        dataset: str,
        split: str,
        dataset_id: Any,
        messages: list[dict[str, str]],
        reference: Any = None,
        meta: dict[str, Any] | None = None,
        prompt: str | None = None,
    ) -> PromptGroup:
        """Build a group, deriving ``prompt_id`` from ``(dataset, split, dataset_id)``."""
        return cls(
            prompt_id=prompt_id_for(dataset, split, dataset_id),
            dataset=dataset,
            split=split,
            dataset_id=str(dataset_id),
            messages=messages,
            reference=reference,
            meta=dict(meta or {}),
            prompt=prompt,
        )

    @property
    def prompt_text(self) -> str:
        """The prompt as stored in ``prompt_index.jsonl``: ``prompt`` when set, else the last
        user message."""
        if self.prompt is not None:
            return self.prompt
        return next((m["content"] for m in reversed(self.messages) if m["role"] == "user"), "")

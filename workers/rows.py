"""The rows a worker writes for a prompt group: ``generations.jsonl`` and
``prompt_index.jsonl`` (docs/formats/worker-jsonl.md), with the grade of each answer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hallulog.contracts.answer_kinds import Grade
from hallulog.contracts.answer_kinds import answer_grader as kinds_answer_grader
from hallulog.contracts.prompt_group import PromptGroup
from hallulog.workers.client import Completion
from hallulog.workers.errors import utc_now
from hallulog.workers.reasoning import reasoning_fields

__all__ = ["answer_grader", "generation_row", "prompt_row", "grade_fields", "split_args"]


def answer_grader(group: PromptGroup) -> Callable[[str], Grade | None]:
    """The grader of one group's answers, prepared once (aliases normalized once): the kind of
    its reference decides (:mod:`hallulog.contracts.answer_kinds`, docs/labels.md). References
    graded after the run (the LLM judge) or missing give None for every answer."""
    grade = kinds_answer_grader(group.reference)
    return grade if grade is not None else _ungraded


def _ungraded(text: str) -> None:
    return None


def generation_row(
    group: PromptGroup,
    sample_id: int,
    comp: Completion,
    params: dict[str, Any],
    graded: Grade | None,
    *,
    model_name: str,
    worker_id: int,
) -> dict[str, Any]:
    """One ``generations.jsonl`` row (``text``: the answer; a reasoning generation adds its
    reasoning fields, ``workers/reasoning.py``)."""
    return {
        "prompt_id": group.prompt_id,
        "sample_id": sample_id,
        "role": "primary" if sample_id == 0 else "sample",
        "text": comp.text,
        "finish_reason": comp.finish_reason,
        "usage": comp.usage,
        "logprobs": comp.logprobs,
        "token_ids": comp.token_ids,
        "request_params": {**params, "model": model_name, "n": 1, "timestamp": utc_now()},
        "generation_time_ms": comp.elapsed_ms,
        **grade_fields(graded),
        "answer_span": list(graded.span) if graded and graded.span is not None else None,
        "worker_id": worker_id,
        **reasoning_fields(comp),
    }


def prompt_row(
    group: PromptGroup,
    primary: Completion,
    primary_row: dict[str, Any],
    *,
    num_generations: int,
    worker_id: int,
) -> dict[str, Any]:
    """The group's ``prompt_index.jsonl`` row; its label fields are the primary answer's
    (``primary_row``: sample 0's generation row)."""
    ref = group.reference
    reference_answer = ref.get("value") if isinstance(ref, dict) else ref
    return {
        "prompt_id": group.prompt_id,
        "dataset": group.dataset,
        "split": group.split,
        "dataset_id": group.dataset_id,
        "prompt": group.prompt_text,
        "messages": group.messages,
        "reference_answer": reference_answer,
        "reference": ref,
        "label": primary_row["label"],
        "label_grader": primary_row["label_grader"],
        "label_status": primary_row["label_status"],
        "meta": group.meta,
        "prompt_token_ids": primary.prompt_token_ids,
        "num_generations": num_generations,
        "worker_id": worker_id,
        "completed_at": utc_now(),
    }


def split_args(comp: Completion) -> dict[str, Any]:
    """``select_positions``' reasoning arguments of a completion (none without reasoning)."""
    split = comp.split
    if split is None:
        return {}
    return {"reasoning": split.reasoning, "answer_start": split.answer_start}


def grade_fields(graded: Grade | None) -> dict[str, Any]:
    """``label``, ``label_grader``, ``label_status`` of a generation row (null: not graded)."""
    if graded is None:
        return {"label": None, "label_grader": None, "label_status": None}
    return {"label": graded.label, "label_grader": graded.grader, "label_status": graded.status}

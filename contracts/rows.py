"""The rows of the run's JSONL files, as types: one TypedDict a table of
docs/formats/worker-jsonl.md and docs/formats/consolidated-jsonl.md.

A field the table marks ``yes`` is required here; one marked ``no`` or with a format tag
(``packed``, ``zarr``, ``npy``, ``positions``, ``reasoning``: present only in such runs or rows) is ``NotRequired``.
tests/postrun/test_jsonl_docs.py checks the types against the tables, and the validator's
field checks (``postrun/row_schemas.py``) against the types.
"""

from typing import Any, NotRequired, TypedDict

from hallulog.contracts import layout

__all__ = [
    "TokenLogprob",
    "RequestParams",
    "PromptRow",
    "GenerationRow",
    "ActivationIndexRow",
    "ErrorRow",
    "ConsolidatedPromptRow",
    "ConsolidatedGenerationRow",
    "ConsolidatedActivationRow",
    "LabelRow",
    "WORKER_ROWS",
    "CONSOLIDATED_ROWS",
]


class TokenLogprob(TypedDict):
    """One entry of a generation's ``logprobs`` (table ``logprobs[]``)."""

    token: str
    logprob: float | None
    top_logprobs: list[dict[str, Any]]
    logit: NotRequired[float]


class RequestParams(TypedDict):
    """What a generation request sent (table ``request_params``)."""

    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    model: str
    n: int
    timestamp: str


class PromptRow(TypedDict):
    """``worker_{i}/prompt_index.jsonl``: one committed prompt group (the commit marker)."""

    prompt_id: str
    dataset: str
    split: str
    dataset_id: str
    prompt: str
    messages: list[dict[str, Any]]
    reference_answer: str | None
    reference: Any
    label: int | None
    label_grader: str | None
    label_status: str | None
    meta: dict[str, Any]
    prompt_token_ids: list[int]
    num_generations: int
    worker_id: int
    completed_at: str
    commit_id: str


class GenerationRow(TypedDict):
    """``worker_{i}/generations.jsonl``: one answer (sample 0 the primary)."""

    prompt_id: str
    sample_id: int
    role: str
    text: str
    finish_reason: str | None
    usage: dict[str, Any]
    logprobs: list[TokenLogprob]
    token_ids: list[int]
    request_params: RequestParams
    generation_time_ms: int
    label: int | None
    label_grader: str | None
    label_status: str | None
    answer_span: list[int] | None
    worker_id: int
    activation_key: str | None
    commit_id: str
    reasoning: NotRequired[str]
    """A reasoning generation's reasoning text (``text`` is its answer alone)."""
    reasoning_span: NotRequired[list[int]]
    answer_token_start: NotRequired[int | None]


class ActivationIndexRow(TypedDict):
    """``worker_{i}/activation_index.jsonl``: where one sample's activations are stored."""

    prompt_id: str
    sample_id: int
    activation_key: str
    layers: list[int]
    sequence_mode: str
    capture_mode: str
    prompt_token_count: int
    response_token_count: int
    row0_position: int
    num_rows: int
    prompt_rows: int
    response_rows: int
    token_positions: NotRequired[list[int]]
    positions: NotRequired[dict[str, list[int]]]
    exact_answer_span: NotRequired[dict[str, Any] | None]
    file_path: str
    byte_offset: NotRequired[int]
    zarr_index: NotRequired[int]
    shape: list[int]
    dtype: str
    size_bytes: int
    worker_id: int
    commit_id: str


class ErrorRow(TypedDict):
    """``worker_{i}/errors.jsonl``: one failure."""

    timestamp: str
    error_type: str
    prompt_id: str | None
    sample_id: int | None
    error_message: str
    stack_trace: str
    worker_id: int
    server_url: str
    reason: NotRequired[str]
    """``capture_failed`` rows of a capture that failed the row check: ``capture_zeros`` …"""


class ConsolidatedPromptRow(PromptRow):
    """``consolidated/prompt_index.jsonl``: the kept commit's prompt row, labels joined."""

    judge_verdict: str | None
    verdict: NotRequired[str]
    abstained: NotRequired[bool]
    judge_model: NotRequired[str | None]


class ConsolidatedGenerationRow(GenerationRow):
    """``consolidated/generations.jsonl``: the worker's row of the kept commit."""


class ConsolidatedActivationRow(ActivationIndexRow):
    """``consolidated/activation_index.jsonl``: the worker's row, with the sample's label."""

    source_path: NotRequired[str]
    label: int


class LabelRow(TypedDict):
    """``labels.jsonl``: a label given after the run (the LLM judge)."""

    prompt_id: str
    label: int | None
    label_grader: str
    verdict: str
    abstained: bool
    judge_model: str | None
    judge_raw: str | None
    judge_details: dict[str, Any] | None
    graded_at: str


WORKER_ROWS: dict[str, type] = {
    layout.PROMPT_INDEX: PromptRow,
    layout.GENERATIONS: GenerationRow,
    layout.ACTIVATION_INDEX: ActivationIndexRow,
    layout.ERRORS: ErrorRow,
}
"""A worker directory's JSONL file → its row type."""

CONSOLIDATED_ROWS: dict[str, type] = {
    layout.PROMPT_INDEX: ConsolidatedPromptRow,
    layout.GENERATIONS: ConsolidatedGenerationRow,
    layout.ACTIVATION_INDEX: ConsolidatedActivationRow,
    layout.LABELS: LabelRow,
}
"""A consolidated JSONL file (and ``labels.jsonl``) → its row type."""

"""The explorer's wire models: what every page shows, as the JSON routes (``/api/...``) return
it and as the templates render it. Logic builds them (``summary.py``, ``index.py``,
``question.py``, ``study.py``); the router only hands them on."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "FILTERS",
    "Filter",
    "QuestionQuery",
    "DetectorCell",
    "QuestionRow",
    "QuestionPage",
    "MethodRank",
    "PerLayer",
    "RunSummary",
    "Alternative",
    "TokenView",
    "GenerationView",
    "ClusterView",
    "QuestionDetail",
    "CompareValue",
    "StudyCell",
    "TransferMatrix",
    "StudyPage",
]

Filter = Literal["all", "hallucinated", "correct", "unlabelled", "disagree"]
FILTERS: tuple[str, ...] = ("all", "hallucinated", "correct", "unlabelled", "disagree")
"""The question filters, in the order the page lists them."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class QuestionQuery(_Model):
    """One request of the question list: filter, text search, sort, page, the detectors shown."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    filter: Filter = "all"
    q: str = Field("", max_length=200, description="text searched in question and answer")
    sort: str = Field("n", description="n (run order), prompt_id, label, status, or a method")
    desc: bool = False
    page: int = Field(1, ge=1)
    per_page: int = Field(50, ge=1, le=500)
    methods: tuple[str, ...] = Field(
        (), description="detectors shown and compared; empty: the default ones"
    )


class DetectorCell(_Model):
    """One detector's score of one question: its rank (1 = the most suspicious of the run) and
    percentile (100 × the share of the run's scored questions with a score ≤ this one)."""

    method: str
    family: str | None = None
    auroc: float | None = None
    score: float | None = None
    rank: int | None = None
    percentile: float | None = None
    scored: int | None = None  # questions with a score of this method (question page)


class QuestionRow(_Model):
    n: int  # row of prompts.parquet (run order)
    prompt_id: str
    question: str | None
    answer: str | None
    label: int | None
    label_status: str | None
    label_grader: str | None
    detectors: list[DetectorCell]
    disagree: bool | None = None


class QuestionPage(_Model):
    query: QuestionQuery
    rows: list[QuestionRow]
    total: int  # questions matching the filter and search
    pages: int
    counts: dict[str, int]  # per filter, with the search applied
    methods: list[str]  # the detectors shown (the query's, or the default)
    default_methods: list[str]
    all_methods: list[str]
    evaluation_missing: str | None = None


class MethodRank(_Model):
    rank: int
    method: str
    family: str | None
    kind: str | None
    auroc: float | None
    auroc_lo: float | None
    auroc_hi: float | None
    prr: float | None
    prr_lo: float | None
    prr_hi: float | None
    n: int | None
    n_hallucinated: int | None
    selected_layers: list[int] | None = None


class PerLayer(_Model):
    method: str
    layer_ids: list[int]
    auroc: list[float | None]
    selected_layers: list[int] | None = None


class RunSummary(_Model):
    root: str
    run_id: str | None
    model: str | None
    dataset: str | None
    split: str | None
    k_samples: int | None
    config: dict[str, Any]  # the run's config as run_manifest.json records it
    counts: dict[str, int]  # prompts, generations, labelled, hallucinated, correct, unlabelled
    label_status: dict[str, int]  # the worker grader's statuses
    graders: dict[str, int]
    protocol: dict[str, Any]
    ranking: list[MethodRank]
    per_layer: list[PerLayer]
    plots: list[str]
    skipped: dict[str, str]
    default_methods: list[str]
    evaluation_missing: str | None = None


class Alternative(_Model):
    text: str
    logprob: float | None
    prob: float | None


class TokenView(_Model):
    text: str
    logprob: float | None
    prob: float | None
    colour: str  # CSS background: red (p → 0) to green (p → 1)
    alternatives: list[Alternative]
    in_span: bool = False  # inside the grader's matched span


class GenerationView(_Model):
    sample_id: int
    role: str | None
    text: str | None
    finish_reason: str | None
    temperature: float | None
    label: int | None
    label_status: str | None
    answer_span: list[int] | None
    span_text: str | None  # the text the grader matched
    tokens: list[TokenView]
    cluster: int | None = None
    mean_logprob: float | None = None


class ClusterView(_Model):
    id: int
    size: int
    share: float  # of the K samples
    samples: list[int]
    text: str  # the first member's answer


class QuestionDetail(_Model):
    prompt_id: str
    n: int
    dataset: str | None
    split: str | None
    dataset_id: str | None
    question: str | None
    prompt: str | None
    messages: list[dict[str, Any]]
    context: str | None
    meta: dict[str, Any]
    reference_answer: str | None
    reference_aliases: list[str]
    label: int | None
    label_status: str | None
    label_grader: str | None
    label_source: str | None
    verdict: str | None
    judge_model: str | None
    judge_verdict: str | None
    abstained: bool | None
    generations: list[GenerationView]
    clusters: list[ClusterView]
    cluster_entropy: float | None
    detectors: list[DetectorCell]
    evaluation_missing: str | None = None


class CompareValue(_Model):
    auroc: float | None
    auroc_lo: float | None
    auroc_hi: float | None
    prr: float | None
    prr_lo: float | None = None
    prr_hi: float | None = None
    fpr_at_95: float | None = None
    fpr_at_95_lo: float | None = None
    fpr_at_95_hi: float | None = None


class StudyCell(_Model):
    name: str
    slug: str  # its folder in the URL and the static export
    axes: dict[str, str]  # axis → its value as shown
    root: str
    problem: str | None = None  # why its run pages cannot open (one line)


class TransferMatrix(_Model):
    method: str
    train: list[str]  # cell names, rows
    test: list[str]  # cell names, columns
    auroc: list[list[float | None]]


class StudyPage(_Model):
    root: str
    name: str | None
    axes: list[str]
    cells: list[StudyCell]
    methods: list[str]
    table: dict[str, dict[str, CompareValue]]  # cell → method → value
    transfer: list[TransferMatrix]
    plots: list[str]
    missing: list[str]  # what the study root lacks, one line each

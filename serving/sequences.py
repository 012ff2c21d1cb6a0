"""What the engine tracks per request: sampling parameters, the output handed back, and the
state of one sequence while it decodes (tokens, logprobs, where its captured rows go)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from hallulog.contracts.capture_dtype import check_capture_dtype
from hallulog.contracts.capture_rows import capture_window, check_capture_rows

__all__ = ["SamplingParams", "TokenLogprob", "SequenceOutput", "SequenceState"]


@dataclass(frozen=True)
class SamplingParams:
    """Per-sequence generation parameters."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_logprobs: int | None = None
    """None: no logprobs; k >= 0: the chosen token's logprob and the k most likely tokens."""
    capture: bool = False
    """Save the hidden states of every token fed to the model (prompt + all generated but last)."""
    capture_rows: str | int = "all"
    """Which of those positions the file holds (``contracts/capture_rows.py``)."""
    attention: bool = False
    """Write the attention summaries of every generated token (``serving/attention_capture.py``)."""
    capture_dtype: str | None = None
    """The file's dtype (``contracts/capture_dtype.py``); None: the model's."""

    def __post_init__(self) -> None:
        check_capture_rows(self.capture_rows)
        check_capture_dtype(self.capture_dtype)
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    logit: float
    top: list[tuple[int, float]]


@dataclass
class SequenceOutput:
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" | "length"
    stop_reason: int | str | None
    logprobs: list[TokenLogprob] | None
    hidden_states_path: str | None = None
    attention_path: str | None = None


@dataclass
class SequenceState:
    """One sequence being generated."""

    prompt_ids: list[int]
    params: SamplingParams
    future: concurrent.futures.Future
    generator: torch.Generator | None
    out_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    file: Any = None  # where the captured rows go (the engine's ``SpoolFile``), once opened
    n_states: int = 0  # rows kept so far
    row0: int = 0  # the position of row 0
    fed: int = 0  # positions fed to the model so far
    keep: tuple[int, int | None] = (0, None)  # the positions params.capture_rows keeps
    summaries: Any = None  # the attention summaries so far (``SequenceSummaries``), if wanted

    def __post_init__(self) -> None:
        self.keep = capture_window(self.params.capture_rows, len(self.prompt_ids))

    def output(self, attention_path: str | None = None) -> SequenceOutput:
        """What the request hears of this finished sequence."""
        return SequenceOutput(
            prompt_token_ids=self.prompt_ids,
            token_ids=list(self.out_ids),
            text=self.text,
            finish_reason=self.finish_reason or "length",
            stop_reason=self.stop_reason,
            logprobs=self.logprobs if self.params.top_logprobs is not None else None,
            attention_path=attention_path,
        )

    @property
    def longest(self) -> int:
        """The most positions this sequence can reach (prompt + ``max_tokens``)."""
        return len(self.prompt_ids) + self.params.max_tokens

    def capture(self, block: torch.Tensor, put: Callable[[int, torch.Tensor], None]) -> None:
        """Take ``block`` ``[tokens, layers, hidden]`` (the next fed positions): the positions of
        ``params.capture_rows`` go to ``put(row, rows)`` at their row of the file. Until the first
        of them comes, row 0 holds the newest position (the file then ends with the last
        position: ``last``)."""
        fed, tokens = self.fed, block.shape[0]
        self.fed = fed + tokens
        start, stop = self.keep
        lo = start - fed
        if lo >= tokens:  # none kept yet: hold the newest position only
            lo, self.n_states = tokens - 1, 0
        elif lo < 0:
            lo = 0
        hi = tokens if stop is None else min(stop - fed, tokens)
        if hi <= lo:  # past the prompt of a ``prompt`` capture
            return
        if self.row0 + self.n_states != fed + lo or self.row0 < start:  # not a continuation
            self.n_states, self.row0 = 0, fed + lo
        put(self.n_states, block[lo:hi] if lo or hi < tokens else block)
        self.n_states += hi - lo

"""What the engine tracks per request: sampling parameters, the output handed back, and the
state of one sequence while it decodes (tokens, logprobs, its capture buffer)."""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field

import torch

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

    def __post_init__(self) -> None:
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
    states: torch.Tensor | None = None  # [capacity, layers, hidden] capture buffer
    n_states: int = 0

    def capture(
        self, outputs: list[torch.Tensor], row: int, tokens: int, max_model_len: int
    ) -> None:
        """Append the last ``tokens`` positions of ``row`` of every layer output to the buffer."""
        first = outputs[0]
        need = self.n_states + tokens
        if self.states is None or need > self.states.shape[0]:
            cap = max(need, len(self.prompt_ids) + min(self.params.max_tokens, 64))
            if self.states is not None:
                cap = max(cap, 2 * self.states.shape[0])
            cap = min(cap, max(max_model_len, need))
            grown = torch.empty(
                (cap, len(outputs), first.shape[-1]), dtype=first.dtype, device="cpu"
            )
            if self.states is not None:
                grown[: self.n_states] = self.states[: self.n_states]
            self.states = grown
        seq_len = first.shape[1]
        torch.stack(
            [out[row, seq_len - tokens :] for out in outputs],
            dim=1,
            out=self.states[self.n_states : need],
        )
        self.n_states = need

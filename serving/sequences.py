"""What the engine tracks per request: sampling parameters, the output handed back, and the
state of one sequence while it decodes (tokens, logprobs, its capture buffer)."""

from __future__ import annotations

import concurrent.futures
import threading
from dataclasses import dataclass, field

import torch
from hallulog.contracts.capture_rows import capture_window, check_capture_rows

__all__ = ["SamplingParams", "TokenLogprob", "SequenceOutput", "SequenceState", "BufferPool"]


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

    def __post_init__(self) -> None:
        check_capture_rows(self.capture_rows)
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
    row0: int = 0  # the position of the buffer's row 0
    fed: int = 0  # positions fed to the model so far
    keep: tuple[int, int | None] = (0, None)  # the positions params.capture_rows keeps

    def __post_init__(self) -> None:
        self.keep = capture_window(self.params.capture_rows, len(self.prompt_ids))

    def capture(
        self, block: torch.Tensor, max_model_len: int, pool: BufferPool | None = None
    ) -> None:
        """Take ``block`` ``[tokens, layers, hidden]`` (the next fed positions): the positions of
        ``params.capture_rows`` are appended to the buffer (taken from ``pool`` when given, an
        outgrown one given back to it). Until the first of them comes, the buffer holds the
        newest position (the file then ends with the last position: ``last``)."""
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
        if lo or hi < tokens:
            block = block[lo:hi]
            tokens = hi - lo
        need = self.n_states + tokens
        if self.states is None or need > self.states.shape[0]:
            ahead = min(self.params.max_tokens, 64)  # decode rows to come
            cap = max(need, len(self.prompt_ids) - min(start, len(self.prompt_ids)) + ahead)
            if self.states is not None:
                cap = max(cap, 2 * self.states.shape[0])
            cap = min(cap, max(max_model_len, need))
            shape = (cap, *block.shape[1:])
            grown = pool.take(shape, block.dtype) if pool else torch.empty(shape, dtype=block.dtype)
            if self.states is not None:
                grown[: self.n_states] = self.states[: self.n_states]
                if pool:
                    pool.give(self.states)
            self.states = grown
        self.states[self.n_states : need] = block
        self.n_states = need


class BufferPool:
    """Capture buffers for reuse: a finished sequence's buffer comes back once its file is
    written, so the sequences of a run do not each touch fresh memory (a page fault per 4 KB).
    Capacities are rounded up to ``ROWS`` tokens; at most ``keep`` buffers of a shape are kept."""

    ROWS = 64

    def __init__(self, keep: int = 256):
        self.keep = keep
        self._free: dict[tuple, list[torch.Tensor]] = {}
        self._lock = threading.Lock()

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        rows = -(-shape[0] // self.ROWS) * self.ROWS
        key = (rows, *shape[1:], dtype)
        with self._lock:
            free = self._free.get(key)
            if free:
                return free.pop()
        return torch.empty((rows, *shape[1:]), dtype=dtype)

    def give(self, buffer: torch.Tensor) -> None:
        key = (*buffer.shape, buffer.dtype)
        with self._lock:
            free = self._free.setdefault(key, [])
            if len(free) < self.keep:
                free.append(buffer)

"""The worker's OpenAI-protocol client: generation and capture requests, retries by tenacity.

The openai client's own retries are off (``max_retries=0``); tenacity retries timeouts, 5xx and
connection errors 3 times with 1 s / 2 s / 4 s backoff and never other 4xx (seed 003 §12).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import openai
from tenacity import (AsyncRetrying, retry_if_exception, stop_after_attempt,
                      wait_exponential)

__all__ = ["BackendClient", "Completion", "is_retryable", "BackendRequestError"]

log = logging.getLogger(__name__)


class BackendRequestError(RuntimeError):
    """A request failed for good (after retries, or a non-retryable 4xx)."""


def is_retryable(exc: BaseException) -> bool:
    """Timeouts, connection errors and 5xx are retried (but not a server's full disk); other
    4xx never."""
    if isinstance(exc, (openai.APITimeoutError, openai.APIConnectionError)):
        return True
    if isinstance(exc, openai.APIStatusError):
        if any(m in str(exc) for m in _NOT_TRANSIENT):
            return False  # a full disk under the server's spool: retrying only waits longer
        return exc.status_code >= 500 or exc.status_code == 429
    return False


#: server error messages that no retry can fix
_NOT_TRANSIENT = ("No space left on device", "Disk quota exceeded", "Read-only file system")


@dataclass
class Completion:
    """One generated answer as the worker needs it."""

    text: str
    finish_reason: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[dict[str, Any]]
    """One dict per generated token: token, logprob, top_logprobs [{token, logprob}], and
    ``logit`` (raw chosen-token logit) where the backend gives it."""
    usage: dict[str, int]
    hidden_states_path: str | None
    elapsed_ms: int


class BackendClient:
    """Async client of one backend (embedded server or vLLM) speaking the OpenAI protocol."""

    def __init__(self, base_url: str, model: str, *, timeout: float = 300.0,
                 attempts: int = 3, backoff_base: float = 1.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._client = openai.AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key="hallulog",
                                          max_retries=0, timeout=timeout)
        self._attempts = attempts
        self._backoff_base = backoff_base

    async def close(self) -> None:
        await self._client.close()

    async def _with_retries(self, call, *args, **kwargs):
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._attempts),
            wait=wait_exponential(multiplier=self._backoff_base, min=self._backoff_base,
                                  max=4 * self._backoff_base),
            retry=retry_if_exception(is_retryable),
            reraise=True,
            before_sleep=lambda rs: log.warning("retrying %s after %s (attempt %d)",
                                                self.base_url, rs.outcome.exception(),
                                                rs.attempt_number),
        )
        async for attempt in retrying:
            with attempt:
                return await call(*args, **kwargs)

    async def chat(self, messages: list[dict[str, str]], *, temperature: float, top_p: float,
                   max_tokens: int, seed: int, capture: bool) -> Completion:
        """One chat completion (n=1) with top-5 logprobs and token ids; optionally captured."""
        extra_body: dict[str, Any] = {"return_token_ids": True}
        if capture:
            extra_body["kv_transfer_params"] = {"include_output_tokens": True}
        start = time.perf_counter()
        resp = await self._with_retries(
            self._client.chat.completions.create, model=self.model, messages=messages,
            temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed, n=1,
            logprobs=True, top_logprobs=5, extra_body=extra_body)
        elapsed_ms = int((time.perf_counter() - start) * 1000)
        body = resp.model_dump()
        choice = body["choices"][0]
        content = (choice.get("logprobs") or {}).get("content") or []
        return Completion(
            text=(choice.get("message") or {}).get("content") or "",
            finish_reason=choice.get("finish_reason"),
            prompt_token_ids=list(body.get("prompt_token_ids") or []),
            token_ids=list(choice.get("token_ids") or []),
            logprobs=[_token_logprob(entry) for entry in content],
            usage=dict(body.get("usage") or {}),
            hidden_states_path=_hidden_states_path(body),
            elapsed_ms=elapsed_ms,
        )

    async def prefill_capture(self, token_ids: list[int]) -> str:
        """Prefill-only request over ``token_ids``; returns the capture file's path."""
        resp = await self._with_retries(
            self._client.completions.create, model=self.model, prompt=token_ids, max_tokens=1,
            temperature=0.0, extra_body={"kv_transfer_params": {"include_output_tokens": False}})
        path = _hidden_states_path(resp.model_dump())
        if not path:
            raise BackendRequestError(f"{self.base_url}: prefill capture returned no "
                                      "kv_transfer_params.hidden_states_path")
        return path


def _token_logprob(entry: dict[str, Any]) -> dict[str, Any]:
    out = {
        "token": entry.get("token"),
        "logprob": entry.get("logprob"),
        "top_logprobs": [{"token": t.get("token"), "logprob": t.get("logprob")}
                         for t in entry.get("top_logprobs") or []],
    }
    if entry.get("logit") is not None:
        out["logit"] = entry["logit"]
    return out


def _hidden_states_path(body: dict[str, Any]) -> str | None:
    params = body.get("kv_transfer_params") or {}
    return params.get("hidden_states_path")

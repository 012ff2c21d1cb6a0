"""The worker's OpenAI-protocol client: generation and capture requests, retries by tenacity.

Requests go over :class:`hallulog.workers.http.HTTPPool` (the protocol is two JSON POSTs). Profiled
against the instant bench backend, the openai SDK's request building and response models, then
httpx's connection pool, then aiohttp's request machinery each cost more of a worker's CPU per
generation than the rest of the worker (docs/performance.md). tenacity retries timeouts,
connection errors, 429 and 5xx, 3 attempts with 1 s / 2 s backoff (capped at 4 s), and never
other 4xx (seed 003 §12); the last error is raised as it is.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any

from hallulog.contracts.attention_wire import ATTENTION_FIELD, ATTENTION_PATHS
from hallulog.contracts.capture_dtype import CAPTURE_DTYPE_FIELD
from hallulog.contracts.capture_rows import CAPTURE_ROWS_FIELD
from hallulog.contracts.errors import HallulogError, RetryableError
from hallulog.contracts.jsonl import encode_line, parse_line
from hallulog.workers.http import HTTPPool
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

__all__ = [
    "BackendClient",
    "Completion",
    "is_retryable",
    "BackendRequestError",
    "BackendHTTPError",
    "RetryableHTTPError",
    "http_error",
]

log = logging.getLogger(__name__)


class BackendRequestError(HallulogError, RuntimeError):
    """A request failed for good (after retries, or a non-retryable 4xx)."""


class BackendHTTPError(BackendRequestError):
    """The backend answered with an HTTP error status that no retry fixes (4xx but 429, or a
    5xx whose message says the server's disk is full)."""

    def __init__(self, url: str, status_code: int, message: str) -> None:
        super().__init__(f"HTTP {status_code} from {url}: {message}")
        self.status_code = status_code


class RetryableHTTPError(BackendHTTPError, RetryableError):
    """HTTP 429 or 5xx: the server may answer the same request later."""


def http_error(url: str, status_code: int, message: str) -> BackendHTTPError:
    """The error for an HTTP error reply: retryable for 429 and 5xx, unless the message says
    the server's disk is full (retrying only waits longer)."""
    transient = (status_code >= 500 or status_code == 429) and not any(
        m in message for m in _NOT_TRANSIENT
    )
    return (RetryableHTTPError if transient else BackendHTTPError)(url, status_code, message)


def is_retryable(exc: BaseException) -> bool:
    """Whether a retry may succeed: the worker's own transport raises
    :class:`~hallulog.contracts.errors.RetryableError` for those (connection failures, timeouts, 429 and
    5xx but a server's full disk). The openai SDK's errors (the LLM judge's client, over httpx)
    are judged by the same rule."""
    if (
        isinstance(exc, (RetryableError, asyncio.TimeoutError))
        or _is_lib_error(exc, "httpx", ("TimeoutException", "TransportError"))
        or _is_openai(exc, "APIConnectionError")
    ):  # APITimeoutError is one too
        return True
    if _is_openai(exc, "APIStatusError"):
        if any(m in str(exc) for m in _NOT_TRANSIENT):
            return False  # a full disk under the server's spool: retrying only waits longer
        status = int(exc.status_code)  # type: ignore[attr-defined]
        return status >= 500 or status == 429
    return False


#: seconds an idle connection is kept for reuse (the servers close theirs after 5 s)
_KEEPALIVE_S = 4.0

#: alternatives asked for per generated token
_TOP_LOGPROBS = 5

#: server error messages that no retry can fix
_NOT_TRANSIENT = ("No space left on device", "Disk quota exceeded", "Read-only file system")


def _is_openai(exc: BaseException, name: str) -> bool:
    """``exc`` is an ``openai.<name>`` (without importing openai where nobody did)."""
    return _is_lib_error(exc, "openai", (name,))


def _is_lib_error(exc: BaseException, module: str, names: tuple[str, ...]) -> bool:
    """``exc`` is one of ``module.<names>`` (without importing a module nobody imported)."""
    lib = sys.modules.get(module)
    return lib is not None and isinstance(exc, tuple(getattr(lib, n) for n in names))


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
    reasoning: str | None = None
    """``message.reasoning`` (``reasoning_content`` before vLLM 0.32) when the server split
    the reasoning out of ``text`` (``workers/reasoning.py``)."""
    split: Any = None
    """The reasoning split (``contracts.reasoning.ReasoningSplit``) once the worker made it."""
    attention_path: str | None = None
    """The server's file of attention summaries (``contracts/attention_wire.py``), if asked."""


class BackendClient:
    """Async client of one backend (embedded server or vLLM) speaking the OpenAI protocol."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        timeout: float = 300.0,
        attempts: int = 3,
        backoff_base: float = 1.0,
        template_kwargs: dict[str, Any] | None = None,
        capture_dtype: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._http = HTTPPool(self.base_url, timeout=timeout, keepalive_s=_KEEPALIVE_S)
        self._attempts = attempts
        self._backoff_base = backoff_base
        #: the chat template's kwargs sent with every chat request (``chat_template_kwargs``)
        self.template_kwargs = dict(template_kwargs or {})
        #: the dtype asked of capture files (the run's stored dtype; ``contracts/capture_dtype.py``)
        self.capture_dtype = capture_dtype

    async def close(self) -> None:
        await self._http.close()

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` as JSON with the retry policy; the reply's JSON object.

        The first attempt goes out without tenacity (its per-call state cost ~5 % of a
        worker's CPU against the instant backend); a retryable failure hands the remaining
        attempts to tenacity with the same waits (1 s, then 2 s with the default base).
        """
        path = f"/v1{path}"
        try:
            return await self._post_once(path, body)
        except Exception as exc:
            if self._attempts < 2 or not is_retryable(exc):
                raise
            self._log_retry(exc, 1)
        await asyncio.sleep(self._backoff_base)
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._attempts - 1),
            wait=wait_exponential(
                multiplier=2 * self._backoff_base,
                min=2 * self._backoff_base,
                max=4 * self._backoff_base,
            ),
            retry=retry_if_exception(is_retryable),
            reraise=True,
            before_sleep=lambda rs: self._log_retry(rs.outcome.exception(), rs.attempt_number + 1),
        )
        async for attempt in retrying:
            with attempt:
                return await self._post_once(path, body)
        raise AssertionError("unreachable: tenacity reraises")

    def _log_retry(self, exc: BaseException | None, attempt: int) -> None:
        log.warning("retrying %s after %s (attempt %d)", self.base_url, exc, attempt)

    async def _post_once(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        status, data = await self._http.post(path, encode_line(body))
        url = self.base_url + path
        if status >= 400:
            raise http_error(url, status, _error_message(data))
        try:
            reply = parse_line(data)
        except ValueError:
            raise BackendRequestError(f"{url}: reply is not JSON ({data[:200]!r})") from None
        if not isinstance(reply, dict):
            raise BackendRequestError(f"{url}: reply is not an object")
        return reply

    async def chat(
        self,
        messages: list[dict[str, str]],
        *,
        temperature: float,
        top_p: float,
        max_tokens: int,
        seed: int,
        capture: bool,
        capture_rows: str | int = "all",
        attention: bool = False,
    ) -> Completion:
        """One chat completion (n=1) with top-5 logprobs and token ids; optionally captured
        (``capture_rows``: which positions the file holds, ``contracts/capture_rows.py``)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": temperature,
            "top_p": top_p,
            "max_tokens": max_tokens,
            "seed": seed,
            "n": 1,
            "logprobs": True,
            "top_logprobs": _TOP_LOGPROBS,
            "return_token_ids": True,
        }
        if capture:
            body["kv_transfer_params"] = _capture_params(True, capture_rows, self.capture_dtype)
        if attention:  # summaries captured during generation (the embedded server)
            body.setdefault("kv_transfer_params", {})[ATTENTION_FIELD] = True
        if self.template_kwargs:
            body["chat_template_kwargs"] = self.template_kwargs
        start = time.perf_counter()
        reply = await self._post("/chat/completions", body)
        elapsed_ms = int((time.perf_counter() - start) * 1000)
        choice = self._first_choice(reply, "chat")
        content = (choice.get("logprobs") or {}).get("content") or []
        message = choice.get("message") or {}
        reasoning = message.get("reasoning")
        return Completion(
            text=message.get("content") or "",
            reasoning=message.get("reasoning_content") if reasoning is None else reasoning,
            finish_reason=choice.get("finish_reason"),
            prompt_token_ids=list(reply.get("prompt_token_ids") or []),
            token_ids=list(choice.get("token_ids") or []),
            logprobs=[_token_logprob(entry) for entry in content],
            usage=_usage(reply.get("usage")),
            hidden_states_path=_hidden_states_path(reply),
            elapsed_ms=elapsed_ms,
            attention_path=_attention_path(reply),
        )

    async def complete(
        self,
        prompt: str,
        *,
        temperature: float,
        top_p: float,
        max_tokens: int,
        seed: int,
        capture: bool,
        capture_rows: str | int = "all",
        attention: bool = False,
    ) -> Completion:
        """One text completion (``/v1/completions``, n=1) of a raw prompt, no chat template:
        token ids and top-5 logprobs in the shape :meth:`chat` gives; optionally captured.

        The legacy logprobs (``tokens``, ``token_logprobs``, ``top_logprobs`` as
        ``{token: logprob}``, the embedded server's ``token_logits``) become one dict per
        token; the alternatives sorted by logprob and cut to 5 (vLLM adds the chosen token to
        them). ``prompt_token_ids`` is top-level on the embedded server, per choice on vLLM.
        """
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "temperature": temperature,
            "top_p": top_p,
            "max_tokens": max_tokens,
            "seed": seed,
            "n": 1,
            "logprobs": _TOP_LOGPROBS,
            "return_token_ids": True,
        }
        if capture:
            body["kv_transfer_params"] = _capture_params(True, capture_rows, self.capture_dtype)
        if attention:  # summaries captured during generation (the embedded server)
            body.setdefault("kv_transfer_params", {})[ATTENTION_FIELD] = True
        start = time.perf_counter()
        reply = await self._post("/completions", body)
        elapsed_ms = int((time.perf_counter() - start) * 1000)
        choice = self._first_choice(reply, "completion")
        return Completion(
            text=choice.get("text") or "",
            finish_reason=choice.get("finish_reason"),
            prompt_token_ids=list(
                reply.get("prompt_token_ids") or choice.get("prompt_token_ids") or []
            ),
            token_ids=list(choice.get("token_ids") or []),
            logprobs=_legacy_logprobs(choice.get("logprobs")),
            usage=_usage(reply.get("usage")),
            hidden_states_path=_hidden_states_path(reply),
            elapsed_ms=elapsed_ms,
            attention_path=_attention_path(reply),
        )

    def _first_choice(self, reply: dict[str, Any], what: str) -> dict[str, Any]:
        """The reply's (only) choice, or a BackendRequestError naming the server."""
        try:
            choice = reply["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise BackendRequestError(f"{self.base_url}: {what} reply without choices") from None
        if not isinstance(choice, dict):
            raise BackendRequestError(f"{self.base_url}: {what} reply's choice is not an object")
        return choice

    async def prefill_capture(self, token_ids: list[int], capture_rows: str | int = "all") -> str:
        """Prefill-only request over ``token_ids``; returns the capture file's path
        (``capture_rows``: which positions the file holds, ``contracts/capture_rows.py``)."""
        reply = await self._post(
            "/completions",
            {
                "model": self.model,
                "prompt": token_ids,
                "max_tokens": 1,
                "temperature": 0.0,
                "kv_transfer_params": _capture_params(False, capture_rows, self.capture_dtype),
            },
        )
        path = _hidden_states_path(reply)
        if not path:
            raise BackendRequestError(
                f"{self.base_url}: prefill capture returned no "
                "kv_transfer_params.hidden_states_path"
            )
        return path


def _capture_params(
    include_output_tokens: bool, rows: str | int, dtype: str | None = None
) -> dict[str, Any]:
    """A capture request's ``kv_transfer_params``; every position (``all``) is the servers'
    default, asked for without the field (a request as before it existed); ``dtype``: the
    file's dtype (``contracts/capture_dtype.py``; None: the model's)."""
    params: dict[str, Any] = {"include_output_tokens": include_output_tokens}
    if rows != "all" and rows != 0:
        params[CAPTURE_ROWS_FIELD] = rows
    if dtype is not None:
        params[CAPTURE_DTYPE_FIELD] = dtype
    return params


def _error_message(body: bytes) -> str:
    """The OpenAI error envelope's message, else the start of the body."""
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body[:300].decode("utf-8", "replace")


def _usage(usage: Any) -> dict[str, Any]:
    """The usage block with the keys the openai SDK's model gave (absent details as None)."""
    usage = usage if isinstance(usage, dict) else {}
    keys = (
        "completion_tokens",
        "prompt_tokens",
        "total_tokens",
        "completion_tokens_details",
        "prompt_tokens_details",
    )
    return {**{k: usage.get(k) for k in keys}, **usage}


def _token_logprob(entry: dict[str, Any]) -> dict[str, Any]:
    # the reply's own top-logprob dicts, trimmed in place: rebuilding them cost ~7 % of a
    # worker's CPU against the instant backend
    top = entry.get("top_logprobs") or []
    for alt in top:
        alt.pop("bytes", None)
    out = {"token": entry.get("token"), "logprob": entry.get("logprob"), "top_logprobs": top}
    if entry.get("logit") is not None:
        out["logit"] = entry["logit"]
    return out


def _legacy_logprobs(logprobs: Any) -> list[dict[str, Any]]:
    """The legacy completions logprobs as :func:`_token_logprob` dicts, one per token."""
    if not isinstance(logprobs, dict):
        return []
    values = logprobs.get("token_logprobs") or []
    tops = logprobs.get("top_logprobs") or []
    logits = logprobs.get("token_logits") or []
    out = []
    for i, token in enumerate(logprobs.get("tokens") or []):
        top = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
        alts = [(t, lp) for t, lp in top.items() if lp is not None]
        best = sorted(alts, key=lambda alt: -alt[1])[:_TOP_LOGPROBS]
        entry = {
            "token": token,
            "logprob": values[i] if i < len(values) else None,
            "top_logprobs": [{"token": t, "logprob": lp} for t, lp in best],
        }
        if i < len(logits) and logits[i] is not None:
            entry["logit"] = logits[i]
        out.append(entry)
    return out


def _hidden_states_path(body: dict[str, Any]) -> str | None:
    params = body.get("kv_transfer_params") or {}
    return params.get("hidden_states_path")


def _attention_path(body: dict[str, Any]) -> str | None:
    paths = (body.get("kv_transfer_params") or {}).get(ATTENTION_PATHS) or [None]
    return paths[0] if isinstance(paths, list) and isinstance(paths[0], str) else None

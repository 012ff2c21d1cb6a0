"""The one client hallulog's graders use to ask an LLM judge (OpenAI chat API).

The openai client's own retries are off; tenacity retries timeouts, connection errors, 429 and
5xx (``attempts`` tries, backoff ``backoff`` s doubling up to 4x) — the worker's policy.
"""

from __future__ import annotations

import asyncio
import logging

from hallulog.contracts.errors import HallulogError

__all__ = ["JudgeClient", "JudgeError", "clip"]

log = logging.getLogger(__name__)


class JudgeError(HallulogError):
    """The judge could not be asked (retries exhausted, or it refused the request)."""

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


def clip(text: str | None, limit: int) -> str:
    """``text`` stripped and cut to ``limit`` characters (marked ``[...]`` when cut)."""
    text = (text or "").strip()
    return text if len(text) <= limit else text[:limit] + " [...]"


class JudgeClient:
    """Chat requests to one judge server at temperature 0.

    ``judge_url`` is the server's base URL (with or without ``/v1``). ``judge_model`` None asks
    the server's ``/v1/models`` once and uses the first model.
    """

    def __init__(
        self,
        judge_url: str,
        *,
        judge_model: str | None = None,
        timeout: float = 120.0,
        attempts: int = 3,
        backoff: float = 1.0,
        seed: int = 0,
    ) -> None:
        import openai

        base = judge_url.rstrip("/")
        if base.endswith("/v1"):
            base = base[:-3]
        self.judge_url = base
        self.judge_model = judge_model
        self.seed = seed
        self._attempts = attempts
        self._backoff = backoff
        self._client = openai.AsyncOpenAI(
            base_url=f"{base}/v1", api_key="hallulog", max_retries=0, timeout=timeout
        )
        self._model_lock = asyncio.Lock()
        self.requests_sent = 0

    async def aclose(self) -> None:
        await self._client.close()

    async def _retrying(self, call, *args, **kwargs):
        import openai
        from hallulog.workers.client import is_retryable
        from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._attempts),
            wait=wait_exponential(
                multiplier=self._backoff, min=self._backoff, max=4 * self._backoff
            ),
            retry=retry_if_exception(is_retryable),
            reraise=True,
            before_sleep=lambda rs: log.warning(
                "judge %s: retrying after %s (attempt %d)",
                self.judge_url,
                rs.outcome.exception(),
                rs.attempt_number,
            ),
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await call(*args, **kwargs)
        except openai.APIStatusError as exc:
            raise JudgeError(
                f"judge {self.judge_url} answered HTTP {exc.status_code}: {clip(str(exc), 500)}",
                permanent=not is_retryable(exc),
            ) from exc
        except openai.OpenAIError as exc:
            raise JudgeError(f"judge {self.judge_url} unreachable: {exc}", permanent=False) from exc

    async def model(self) -> str:
        """The judge model's name (asked once from ``/v1/models`` when not given)."""
        if self.judge_model:
            return self.judge_model
        async with self._model_lock:
            if not self.judge_model:
                page = await self._retrying(self._client.models.list)
                ids = [m.id for m in page.data]
                if not ids:
                    raise JudgeError(
                        f"judge {self.judge_url}/v1/models lists no model; pass --judge-model",
                        permanent=True,
                    )
                self.judge_model = ids[0]
        return self.judge_model

    async def ask(self, prompt: str, max_tokens: int) -> str:
        """One judge request (chat, temperature 0); returns the reply text."""
        model = await self.model()
        self.requests_sent += 1
        resp = await self._retrying(
            self._client.chat.completions.create,
            model=model,
            messages=[{"role": "user", "content": prompt}],
            temperature=0.0,
            top_p=1.0,
            max_tokens=max_tokens,
            seed=self.seed,
            n=1,
        )
        return (resp.choices[0].message.content or "") if resp.choices else ""

"""FastAPI routes: validate the request, turn it into engine sequences, await them, shape the reply.

Handlers never block on generation: they await the engine's futures.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from hallulog.contracts.attention_wire import ATTENTION_PATHS
from hallulog.contracts.errors import HallulogError
from hallulog.contracts.reasoning import markers_from_vocab, split_reasoning
from hallulog.serving import protocol as P
from hallulog.serving.engine import Engine, SamplingParams, SequenceOutput
from hallulog.serving.engine_pool import EnginePool
from hallulog.serving.metrics import ServingMetrics
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)


class ApiError(HallulogError):
    """An error with an HTTP status, answered in the OpenAI envelope."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def create_app(engine: Engine | EnginePool, model_name: str, metrics: ServingMetrics) -> FastAPI:
    """The HTTP app over a started (or startable) engine; the app's lifespan stops the engine."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        engine.stop()

    app = FastAPI(title="hallulog serving", lifespan=lifespan)
    tokenizer = engine.tokenizer

    # reasoning split by the tokenizer's own think tokens (docs/reasoning.md)
    markers = markers_from_vocab(tokenizer.get_added_vocab())

    def message(prompt_ids: list[int], out: SequenceOutput) -> P.ChatResponseMessage:
        split = split_reasoning(prompt_ids, out.token_ids, markers)
        if split is None:
            return P.ChatResponseMessage(content=out.text)
        s, e = split.reasoning
        a = split.answer_start
        ids = out.token_ids
        return P.ChatResponseMessage(
            reasoning=tokenizer.decode(ids[s:e], skip_special_tokens=True),
            content=None if a is None else tokenizer.decode(ids[a:], skip_special_tokens=True),
        )

    @functools.lru_cache(maxsize=65536)
    def token_text(token_id: int) -> str:
        return tokenizer.decode([token_id])

    # ---- errors --------------------------------------------------------------------------

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError):
        return JSONResponse(P.error_body(exc.message, exc.status), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError):
        parts = []
        for err in exc.errors():
            where = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
            parts.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
        return JSONResponse(P.error_body("; ".join(parts) or "invalid request", 400), 400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException):
        return JSONResponse(P.error_body(str(exc.detail), exc.status_code), exc.status_code)

    @app.exception_handler(Exception)
    async def _internal_error(_request: Request, exc: Exception):
        logger.exception("request failed")
        return JSONResponse(P.error_body(f"{type(exc).__name__}: {exc}", 500), 500)

    # ---- routes --------------------------------------------------------------------------

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> P.ModelList:
        card = P.ModelCard(
            id=model_name, root=str(engine.loaded.path), max_model_len=engine.loaded.max_model_len
        )
        return P.ModelList(data=[card])

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/chat/completions")
    async def chat(req: P.ChatCompletionRequest) -> P.ChatCompletionResponse:
        _check_model(req.model)
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        try:
            text = tokenizer.apply_chat_template(
                messages,
                add_generation_prompt=True,
                tokenize=False,
                **(req.chat_template_kwargs or {}),
            )
        except Exception as exc:  # noqa: BLE001 - template errors are the caller's input
            raise ApiError(400, f"cannot apply the chat template: {exc}") from exc
        prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        outputs, transfer = await _generate(req, prompt_ids, prefill_only=False)
        choices = [
            P.ChatChoice(
                index=i,
                message=message(prompt_ids, out),
                logprobs=_chat_logprobs(out, token_text),
                finish_reason=out.finish_reason,
                stop_reason=out.stop_reason,
                token_ids=out.token_ids if req.return_token_ids else None,
            )
            for i, out in enumerate(outputs)
        ]
        return P.ChatCompletionResponse(
            model=model_name,
            choices=choices,
            usage=_usage(prompt_ids, outputs),
            prompt_token_ids=prompt_ids if req.return_token_ids else None,
            kv_transfer_params=transfer,
        )

    @app.post("/v1/completions")
    async def completions(req: P.CompletionRequest) -> P.CompletionResponse:
        _check_model(req.model)
        by_ids = isinstance(req.prompt, list)
        prompt_ids = list(req.prompt) if by_ids else tokenizer(req.prompt)["input_ids"]
        prefill_only = by_ids and req.max_tokens == 1
        outputs, transfer = await _generate(req, prompt_ids, prefill_only=prefill_only)
        choices = [
            P.CompletionChoice(
                index=i,
                text=out.text,
                logprobs=_completion_logprobs(out, token_text),
                finish_reason=out.finish_reason,
                stop_reason=out.stop_reason,
                prompt_token_ids=prompt_ids if req.return_token_ids else None,
                token_ids=out.token_ids if req.return_token_ids else None,
            )
            for i, out in enumerate(outputs)
        ]
        return P.CompletionResponse(
            model=model_name,
            choices=choices,
            usage=_usage(prompt_ids, outputs),
            prompt_token_ids=prompt_ids if req.return_token_ids else None,
            kv_transfer_params=transfer,
        )

    # ---- helpers -------------------------------------------------------------------------

    def _check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise ApiError(404, f"The model `{name}` does not exist.")

    async def _generate(req, prompt_ids: list[int], *, prefill_only: bool):
        limit = engine.loaded.max_model_len
        max_tokens = req.token_limit() or (limit - len(prompt_ids))
        if len(prompt_ids) + max_tokens > limit:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the prompt, "
                f"{max_tokens} for the completion).",
            )
        capture = engine.capture_enabled and (req.include_output_tokens() or prefill_only)
        if (req.include_output_tokens() or prefill_only) and not engine.capture_enabled:
            logger.debug("capture asked for but this server has no --spool-dir")
        temperature = 1.0 if req.temperature is None else req.temperature
        futures = []
        try:
            capture_rows, capture_dtype = req.capture_rows(), req.capture_dtype()
            for i in range(req.n):
                params = SamplingParams(
                    max_tokens=max_tokens,
                    temperature=temperature,
                    top_p=1.0 if req.top_p is None else req.top_p,
                    seed=None if req.seed is None else req.seed + i,
                    stop=tuple(req.stop_list()),
                    top_logprobs=req.num_top_logprobs(),
                    # like vLLM only the last child's file is returned, so only it is written
                    capture=capture and i == req.n - 1,
                    capture_rows=capture_rows,
                    attention=req.attention(),
                    capture_dtype=capture_dtype,
                )
                futures.append(engine.submit(prompt_ids, params))
        except ValueError as exc:
            for fut in futures:
                fut.cancel()
            raise ApiError(400, str(exc)) from exc
        outputs: list[SequenceOutput] = await asyncio.gather(
            *(asyncio.wrap_future(f) for f in futures)
        )
        path = outputs[-1].hidden_states_path if capture else None
        transfer = {"hidden_states_path": path} if path else {}
        if req.attention():  # contracts/attention_wire.py
            transfer[ATTENTION_PATHS] = [out.attention_path for out in outputs]
        return outputs, transfer or None

    return app


def _usage(prompt_ids: list[int], outputs: list[SequenceOutput]) -> P.Usage:
    completion = sum(len(out.token_ids) for out in outputs)
    return P.Usage(
        prompt_tokens=len(prompt_ids),
        completion_tokens=completion,
        total_tokens=len(prompt_ids) + completion,
    )


def _utf8(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def _chat_logprobs(out: SequenceOutput, token_text) -> P.ChatLogprobs | None:
    if out.logprobs is None:
        return None
    content = []
    for entry in out.logprobs:
        token = token_text(entry.token_id)
        top = [
            P.TopLogprob(token=token_text(t), logprob=lp, bytes=_utf8(token_text(t)))
            for t, lp in entry.top
        ]
        content.append(
            P.ChatTokenLogprob(
                token=token,
                logprob=entry.logprob,
                bytes=_utf8(token),
                top_logprobs=top,
                logit=entry.logit,
            )
        )
    return P.ChatLogprobs(content=content)


def _completion_logprobs(out: SequenceOutput, token_text) -> P.CompletionLogprobs | None:
    if out.logprobs is None:
        return None
    tokens, token_logprobs, top_logprobs, offsets, logits = [], [], [], [], []
    offset = 0
    for entry in out.logprobs:
        token = token_text(entry.token_id)
        tokens.append(token)
        token_logprobs.append(entry.logprob)
        logits.append(entry.logit)
        offsets.append(offset)
        offset += len(token)
        top = {token_text(t): lp for t, lp in entry.top}
        top.setdefault(token, entry.logprob)  # vLLM always lists the chosen token too
        top_logprobs.append(top)
    return P.CompletionLogprobs(
        text_offset=offsets,
        token_logprobs=token_logprobs,
        tokens=tokens,
        top_logprobs=top_logprobs,
        token_logits=logits,
    )

"""Wire models of the OpenAI-compatible API (requests validated here, responses built here).

Field names follow OpenAI and, for the extensions, vLLM (``return_token_ids``,
``prompt_token_ids``, ``token_ids``, ``stop_reason``, ``kv_transfer_params``). hallulog adds the
raw logit of each chosen token (``logit`` per chat logprob entry, ``token_logits`` in the legacy
completions logprobs). Unknown request fields are ignored, as vLLM does.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from hallulog.contracts.attention_wire import ATTENTION_FIELD
from hallulog.contracts.capture_dtype import CAPTURE_DTYPE_FIELD, check_capture_dtype
from hallulog.contracts.capture_rows import CAPTURE_ROWS_FIELD, check_capture_rows
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_TOP_LOGPROBS = 20


class _SamplingFields(BaseModel):
    """Request fields shared by chat and completions."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    n: int = Field(1, ge=1, le=128)
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = None
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    stream: bool = False
    return_token_ids: bool | None = None
    kv_transfer_params: dict[str, Any] | None = None

    @field_validator("stream")
    @classmethod
    def _no_stream(cls, value: bool) -> bool:
        if value:
            raise ValueError("stream=true is not supported by the embedded server")
        return value

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return [s for s in stops if s]

    def include_output_tokens(self) -> bool:
        return bool((self.kv_transfer_params or {}).get("include_output_tokens"))

    def attention(self) -> bool:
        """``kv_transfer_params.hallulog_attention``: write each choice's attention summaries
        (``contracts/attention_wire.py``)."""
        return bool((self.kv_transfer_params or {}).get(ATTENTION_FIELD))

    def capture_rows(self) -> str | int:
        """``kv_transfer_params.hallulog_capture_rows``: the positions a capture file holds
        (``contracts/capture_rows.py``; default ``all``); ValueError for a bad value."""
        return check_capture_rows((self.kv_transfer_params or {}).get(CAPTURE_ROWS_FIELD))

    def capture_dtype(self) -> str | None:
        """``kv_transfer_params.hallulog_capture_dtype``: the capture file's dtype
        (``contracts/capture_dtype.py``; None: the model's); ValueError for a bad value."""
        return check_capture_dtype((self.kv_transfer_params or {}).get(CAPTURE_DTYPE_FIELD))


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts are supported")
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    max_completion_tokens: int | None = Field(None, ge=1)
    chat_template_kwargs: dict[str, Any] | None = None
    """Keyword arguments for the chat template (vLLM's field of the same name)."""

    @model_validator(mode="after")
    def _check(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs=true")
        for message in self.messages:
            message.text()
        return self

    def num_top_logprobs(self) -> int | None:
        """None: no logprobs; else how many alternatives per token."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] = Field(union_mode="left_to_right")
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, value: str | list[int]) -> str | list[int]:
        if isinstance(value, list) and not value:
            raise ValueError("prompt must not be empty")
        if isinstance(value, list) and min(value) < 0:
            raise ValueError("prompt token ids must be non-negative")
        return value

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool) -> bool:
        if value:
            raise ValueError("echo=true is not supported by the embedded server")
        return value

    def num_top_logprobs(self) -> int | None:
        return self.logprobs

    def token_limit(self) -> int | None:
        return self.max_tokens


# ---- responses -------------------------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]
    logit: float  # hallulog extension: raw logit of the chosen token


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob]


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    """The answer; for a reasoning generation the text after the end marker (None when the
    reasoning never closed), as vLLM with a reasoning parser returns it."""
    reasoning: str | None = None
    """The reasoning text (vLLM 0.32's field); None when the generation does not reason."""


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length"]
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(BaseModel):
    id: str = Field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_token_ids: list[int] | None = None
    kv_transfer_params: dict[str, Any] | None = None


class CompletionLogprobs(BaseModel):
    text_offset: list[int]
    token_logprobs: list[float]
    tokens: list[str]
    top_logprobs: list[dict[str, float]]
    token_logits: list[float]  # hallulog extension: raw logit of each chosen token


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length"]
    stop_reason: int | str | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None


class CompletionResponse(BaseModel):
    id: str = Field(default_factory=lambda: f"cmpl-{uuid.uuid4().hex}")
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    prompt_token_ids: list[int] | None = None
    kv_transfer_params: dict[str, Any] | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "hallulog"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def error_body(message: str, status: int) -> dict[str, Any]:
    """OpenAI/vLLM error envelope."""
    kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}

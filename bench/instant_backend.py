"""An instant OpenAI-protocol backend for benchmarks: no model, canned answers, random hidden states.

A bench tool, never a default and never started by the orchestrator: it measures what hallulog
itself costs per generation (orchestrator, workers, post-run) with the inference cost taken out.
It speaks the protocol and capture contract of the embedded server (docs/serving.md,
docs/contracts.md) as far as the worker uses them:

- ``GET /health`` (200), ``GET /v1/models``, ``GET /metrics`` (``vllm:prompt_tokens_total``,
  ``vllm:generation_tokens_total``, ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  which the watchdog reads, plus ``hallulog_instant_requests_total``);
- ``POST /v1/chat/completions``: ``n`` choices of ``max_tokens`` canned tokens (at most
  ``--answer-tokens``), each with ``logprobs.content`` (token, logprob, bytes, top_logprobs,
  logit), ``token_ids`` and ``prompt_token_ids`` (``return_token_ids``), usage;
  ``kv_transfer_params: {"include_output_tokens": true}`` writes a capture file of prompt + every
  generated token but the last (the last choice, as vLLM does);
- ``kv_transfer_params.hallulog_capture_rows`` (``all``, ``prompt``, ``response``, ``last``, a
  position): the file holds only those positions and says where it starts (``row0`` in its
  metadata; docs/contracts.md);
- ``POST /v1/completions`` with ``prompt`` a list of token ids and ``max_tokens=1``: prefill
  capture of every token given; with a text ``prompt`` (``--chat false``): the same canned
  answer as chat, legacy ``logprobs`` (``tokens``, ``token_logprobs``, ``top_logprobs`` as
  ``{token: logprob}``, ``token_logits``), token ids and generation capture.

Capture files are safetensors with ``hidden_states [num_tokens, num_layer_ids, hidden]`` (float16,
random) and ``token_ids [num_tokens]`` int64, renamed into place under ``--spool-dir`` with the
``PATH.lock`` flock protocol of ``serving/capture.py``. Each file is written with one ``writev``
of the header, a slice of one pre-drawn pool of rows and the token ids (no serialisation copy),
so the backend's own cost per capture byte is one copy into the spool, as small as a backend's
can be. ``--model-shape`` gives real models' captures: ``8b`` = 32 decoder layers × 4096 (33 layer
ids with the embedding output), ``70b`` = 80 × 8192 (81), or ``LAYERS:HIDDEN``.

Prompt token ids are a pure function of the message (or prompt) text (one id per UTF-8 byte,
capped at ``--max-prompt-tokens``), so a prefill capture of prompt + answer checks out against
the worker's expectation. The HTTP layer is a minimal asyncio HTTP/1.1 server with keep-alive: the backend's
own CPU competes with what is being measured on a small machine, so it is kept small.

    python bench/instant_backend.py --port 9201 --spool-dir /tmp/spool --num-layer-ids 3 \\
        --hidden-size 64
    python bench/instant_backend.py --port 9201 --spool-dir /dev/shm/spool --model-shape 8b
        # 33 layer ids x 4096 (every layer: the integrated profile); --num-layer-ids 2 for probes
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

# the capture-rows rule the servers share
from hallulog.contracts.capture_rows import (
    CAPTURE_ROWS_FIELD,
    ROW0_KEY,
    capture_span,
    check_capture_rows,
)

#: extra pool rows: captures start at one of this many offsets (``InstantBackend.pool_offset``)
_POOL_SPARE = 61

#: ``--model-shape`` names: (num_hidden_layers, hidden_size) of the Llama-3 8B and 70B models
MODEL_SHAPES = {"8b": (32, 4096), "70b": (80, 8192)}


def parse_model_shape(text: str) -> tuple[int, int]:
    """``8b``, ``70b`` or ``LAYERS:HIDDEN`` → (num_hidden_layers, hidden_size)."""
    if text.lower() in MODEL_SHAPES:
        return MODEL_SHAPES[text.lower()]
    try:
        layers, hidden = (int(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(
            f"--model-shape: expected 8b, 70b or LAYERS:HIDDEN such as 32:4096, got {text!r}"
        ) from None
    if layers < 1 or hidden < 1:
        raise ValueError(f"--model-shape: layers and hidden size must be >= 1, got {text!r}")
    return layers, hidden


_VOCAB = [
    "The",
    " answer",
    " is",
    " Paris",
    ",",
    " of",
    " course",
    ".",
    " It",
    " was",
    " in",
    " 1889",
    " by",
    " Gustave",
    " Eiffel",
    " himself",
]


class InstantBackend:
    """Canned generations and random captures; counts what it served."""

    def __init__(
        self,
        *,
        model: str,
        spool_dir: Path | None,
        num_layer_ids: int,
        hidden_size: int,
        answer_tokens: int,
        max_prompt_tokens: int,
        seed: int = 0,
        vary_rows: bool = False,
        latency_s: float = 0.0,
    ) -> None:
        self.model = model
        self.latency_s = latency_s
        self.spool_dir = spool_dir
        if spool_dir is not None:
            spool_dir.mkdir(parents=True, exist_ok=True)
        self.num_layer_ids = num_layer_ids
        self.hidden_size = hidden_size
        self.answer_tokens = answer_tokens
        self.max_prompt_tokens = max_prompt_tokens
        self.vary_rows = vary_rows
        rng = np.random.default_rng(seed)
        # one pool of random rows, sliced per capture (drawing fresh numbers per request would
        # make the backend the bottleneck on a small machine)
        pool_tokens = max_prompt_tokens + answer_tokens + 1 + _POOL_SPARE
        self._pool = rng.standard_normal((pool_tokens, num_layer_ids, hidden_size)).astype(
            np.float16
        )
        self._entries = [self._logprob_entry(i) for i in range(len(_VOCAB))]
        self.requests = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.running = 0
        self.captures = 0
        self.capture_bytes = 0

    @staticmethod
    def _logprob_entry(i: int) -> dict[str, Any]:
        tok = _VOCAB[i]
        top = [
            {
                "token": _VOCAB[(i + j) % len(_VOCAB)],
                "logprob": -0.05 - 1.1 * j,
                "bytes": list(_VOCAB[(i + j) % len(_VOCAB)].encode()),
            }
            for j in range(5)
        ]
        return {
            "token": tok,
            "logprob": -0.05,
            "bytes": list(tok.encode()),
            "top_logprobs": top,
            "logit": 12.5 - 0.1 * i,
        }

    # ---- the protocol ---------------------------------------------------------------------

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        text = "".join(f"<{m.get('role')}>{_text(m.get('content'))}" for m in messages)
        return list(text.encode("utf-8")[: self.max_prompt_tokens]) or [1]

    def answer(self, max_tokens: int | None, offset: int) -> list[int]:
        n = min(self.answer_tokens, max_tokens or self.answer_tokens)
        return [1000 + (offset + j) % len(_VOCAB) for j in range(n)]

    def capture(
        self, token_ids: list[int], kv: dict[str, Any] | None = None, prompt_len: int = 0
    ) -> str | None:
        """Write the capture file of positions ``token_ids`` (the positions that
        ``kv[hallulog_capture_rows]`` asks for; ``prompt_len``: the request's prompt tokens)."""
        if self.spool_dir is None:
            return None
        try:
            rows = check_capture_rows((kv or {}).get(CAPTURE_ROWS_FIELD))
        except ValueError as exc:
            raise _HttpError(400, str(exc)) from None
        name = f"hs-{uuid.uuid4().hex}"
        final = self.spool_dir / f"{name}.safetensors"
        tmp = self.spool_dir / f".{name}.safetensors.partial"
        n = len(token_ids)
        if n > len(self._pool) - _POOL_SPARE:
            raise _HttpError(400, f"{n} tokens to capture, the pool holds {len(self._pool)}")
        start = self.pool_offset(token_ids) if self.vary_rows else 0
        row0, stop = capture_span(rows, prompt_len=prompt_len, num_tokens=n)
        hidden = self._pool[start + row0 : start + stop]  # contiguous rows of the pool
        ids = np.asarray(token_ids[row0:stop], dtype="<i8")
        head = _safetensors_header(
            {
                "hidden_states": ("F16", hidden.shape, hidden.nbytes),
                "token_ids": ("I64", ids.shape, ids.nbytes),
            },
            {ROW0_KEY: str(row0)},
        )
        with open(f"{final}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                parts = [
                    memoryview(head),
                    memoryview(hidden.reshape(-1).view(np.uint8)),
                    memoryview(ids.view(np.uint8)),
                ]
                total = sum(len(p) for p in parts)
                done = os.writev(fd, parts)
                while done < total:  # a short write: the rest, plainly
                    rest = b"".join(bytes(p) for p in parts)[done:]
                    done += os.write(fd, rest)
            finally:
                os.close(fd)
            os.replace(tmp, final)
        self.captures += 1
        self.capture_bytes += total
        return str(final)

    @staticmethod
    def pool_offset(token_ids: list[int]) -> int:
        """With ``--vary-rows``, where a capture's rows start in the pool: a function of its
        token ids, so captures of different prompts differ (a probe fitted on them is not
        degenerate: ``evaluate`` on a bench run) and the same tokens give the same rows.
        Without it, row p of every capture is pool row p (tests rely on it)."""
        return (sum(token_ids) * 31 + len(token_ids)) % _POOL_SPARE

    def chat(self, req: dict[str, Any]) -> dict[str, Any]:
        prompt = self.prompt_ids(req.get("messages") or [])
        n = int(req.get("n") or 1)
        want_ids = bool(req.get("return_token_ids"))
        want_lp = bool(req.get("logprobs"))
        top = int(req.get("top_logprobs") or 0)
        limit = req.get("max_completion_tokens") or req.get("max_tokens")
        seed = int(req.get("seed") or 0)
        choices, completion = [], 0
        answer: list[int] = []
        for i in range(n):
            answer = self.answer(limit, seed + i)
            completion += len(answer)
            entries = [self._entries[t - 1000] for t in answer]
            if top != 5:
                entries = [{**e, "top_logprobs": e["top_logprobs"][:top]} for e in entries]
            choices.append(
                {
                    "index": i,
                    "message": {
                        "role": "assistant",
                        "content": "".join(_VOCAB[t - 1000] for t in answer),
                    },
                    "logprobs": {"content": entries} if want_lp else None,
                    "finish_reason": "length" if limit and len(answer) >= limit else "stop",
                    "stop_reason": None,
                    "token_ids": answer if want_ids else None,
                }
            )
        kv = req.get("kv_transfer_params") or {}
        path = (
            self.capture(prompt + answer[:-1], kv, len(prompt))
            if kv.get("include_output_tokens")
            else None
        )
        self._count(len(prompt) * n, completion)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": completion,
                "total_tokens": len(prompt) + completion,
            },
            "prompt_token_ids": prompt if want_ids else None,
            "kv_transfer_params": {"hidden_states_path": path} if path else None,
        }

    def completions(self, req: dict[str, Any]) -> dict[str, Any]:
        prompt = req.get("prompt")
        if isinstance(prompt, str) and prompt:
            ids = list(prompt.encode("utf-8")[: self.max_prompt_tokens])
        elif isinstance(prompt, list) and prompt:
            ids = list(prompt)
        else:
            raise _HttpError(400, "prompt must be a non-empty string or list of token ids")
        limit = req.get("max_tokens")
        answer = self.answer(limit, int(req.get("seed") or 0))
        kv = req.get("kv_transfer_params") or {}
        if isinstance(prompt, list) and limit == 1:  # prefill capture of every token given
            path = self.capture(ids, kv, len(ids))
        elif kv.get("include_output_tokens"):
            path = self.capture(ids + answer[:-1], kv, len(ids))
        else:
            path = None
        self._count(len(ids), len(answer))
        want_ids = bool(req.get("return_token_ids"))
        top = req.get("logprobs")
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "text": "".join(_VOCAB[t - 1000] for t in answer),
                    "logprobs": None
                    if top is None
                    else _legacy([self._entries[t - 1000] for t in answer], int(top)),
                    "finish_reason": "length" if limit and len(answer) >= limit else "stop",
                    "stop_reason": None,
                    "prompt_token_ids": ids if want_ids else None,
                    "token_ids": answer if want_ids else None,
                }
            ],
            "usage": {
                "prompt_tokens": len(ids),
                "completion_tokens": len(answer),
                "total_tokens": len(ids) + len(answer),
            },
            "prompt_token_ids": ids if want_ids else None,
            "kv_transfer_params": {"hidden_states_path": path} if path else None,
        }

    def _count(self, prompt_tokens: int, generation_tokens: int) -> None:
        self.requests += 1
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += generation_tokens

    def metrics(self) -> str:
        label = f'{{model_name="{self.model}"}}'
        return "".join(
            [
                "# TYPE vllm:prompt_tokens_total counter\n",
                f"vllm:prompt_tokens_total{label} {float(self.prompt_tokens)}\n",
                "# TYPE vllm:generation_tokens_total counter\n",
                f"vllm:generation_tokens_total{label} {float(self.generation_tokens)}\n",
                "# TYPE vllm:num_requests_running gauge\n",
                f"vllm:num_requests_running{label} {float(self.running)}\n",
                "# TYPE vllm:num_requests_waiting gauge\n",
                f"vllm:num_requests_waiting{label} 0.0\n",
                "# TYPE hallulog_instant_requests_total counter\n",
                f"hallulog_instant_requests_total{label} {float(self.requests)}\n",
                "# TYPE hallulog_serving_captures_total counter\n",
                f"hallulog_serving_captures_total{label} {float(self.captures)}\n",
                "# TYPE hallulog_instant_capture_bytes_total counter\n",
                f"hallulog_instant_capture_bytes_total{label} {float(self.capture_bytes)}\n",
            ]
        )

    # ---- HTTP ------------------------------------------------------------------------------

    def route(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        path = path.split("?", 1)[0]
        if method == "GET" and path == "/health":
            return 200, "text/plain", b""
        if method == "GET" and path == "/metrics":
            return 200, "text/plain; version=0.0.4", self.metrics().encode()
        if method == "GET" and path == "/v1/models":
            return (
                200,
                "application/json",
                json.dumps(
                    {
                        "object": "list",
                        "data": [
                            {
                                "id": self.model,
                                "object": "model",
                                "created": int(time.time()),
                                "owned_by": "hallulog-instant",
                                "root": None,
                                "max_model_len": 1 << 16,
                            }
                        ],
                    }
                ).encode(),
            )
        if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            try:
                req = json.loads(body or b"{}")
            except ValueError as exc:
                raise _HttpError(400, f"invalid JSON body: {exc}") from None
            if req.get("stream"):
                raise _HttpError(400, "stream=true is not supported")
            self.running += 1
            try:
                out = self.chat(req) if path.endswith("chat/completions") else self.completions(req)
            finally:
                self.running -= 1
            return 200, "application/json", json.dumps(out, separators=(",", ":")).encode()
        raise _HttpError(404, f"{method} {path}: not found")

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _version = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                length = int(headers.get("content-length") or 0)
                body = await reader.readexactly(length) if length else b""
                if self.latency_s and method == "POST":
                    await asyncio.sleep(self.latency_s)  # a slower server, without blocking others
                try:
                    status, ctype, payload = self.route(method, target, body)
                except _HttpError as exc:
                    status, ctype = exc.status, "application/json"
                    payload = json.dumps(
                        {
                            "error": {
                                "message": exc.message,
                                "type": "BadRequestError",
                                "param": None,
                                "code": exc.status,
                            }
                        }
                    ).encode()
                close = headers.get("connection", "").lower() == "close"
                writer.write(
                    f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}\r\n"
                    f"content-type: {ctype}\r\ncontent-length: {len(payload)}\r\n"
                    f"connection: {'close' if close else 'keep-alive'}\r\n\r\n".encode()
                    + payload
                )
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()


class _HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}


def _safetensors_header(
    tensors: dict[str, tuple[str, tuple[int, ...], int]], metadata: dict[str, str] | None = None
) -> bytes:
    """The 8-byte length and JSON header of a safetensors file whose tensors follow in order
    (``metadata``: its ``__metadata__``, string values)."""
    meta: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, (dtype, shape, nbytes) in tensors.items():
        meta[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    text = json.dumps(meta, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    return len(text).to_bytes(8, "little") + text


def _legacy(entries: list[dict[str, Any]], top: int) -> dict[str, Any]:
    """Chat logprob entries in the legacy completions shape (chosen token among the top)."""
    offsets, offset = [], 0
    for e in entries:
        offsets.append(offset)
        offset += len(e["token"])
    return {
        "text_offset": offsets,
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [
            {
                **{t["token"]: t["logprob"] for t in e["top_logprobs"][:top]},
                e["token"]: e["logprob"],
            }
            for e in entries
        ],
        "token_logits": [e["logit"] for e in entries],
    }


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


async def serve(backend: InstantBackend, host: str, port: int) -> None:
    server = await asyncio.start_server(backend.handle, host, port, limit=1 << 24, backlog=1024)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument(
        "--spool-dir",
        type=Path,
        default=None,
        help="where capture files go (none: captures answered without a file)",
    )
    p.add_argument(
        "--num-layer-ids",
        type=int,
        default=None,
        help="layer ids per capture (the run's layer ids; default with --model-shape: "
        "every layer, LAYERS + 1)",
    )
    p.add_argument("--hidden-size", type=int, default=None)
    p.add_argument(
        "--model-shape",
        default=None,
        metavar="8b|70b|LAYERS:HIDDEN",
        help="a real model's capture shape: 8b = 32:4096, 70b = 80:8192",
    )
    p.add_argument("--answer-tokens", type=int, default=12)
    p.add_argument("--max-prompt-tokens", type=int, default=48)
    p.add_argument("--served-model-name", default="instant")
    p.add_argument(
        "--latency-ms",
        type=float,
        default=0.0,
        help="wait this long before answering each POST (a run that cannot finish in a blink)",
    )
    p.add_argument(
        "--vary-rows",
        action="store_true",
        help="start each capture at a pool row that depends on its tokens (else "
        "every capture's row p is the same pool row p)",
    )
    args = p.parse_args(argv)
    if args.model_shape:
        try:
            layers, hidden = parse_model_shape(args.model_shape)
        except ValueError as exc:
            p.error(str(exc))
        args.hidden_size = args.hidden_size or hidden
        args.num_layer_ids = args.num_layer_ids or layers + 1
    if args.num_layer_ids is None or args.hidden_size is None:
        p.error("give --num-layer-ids and --hidden-size, or --model-shape")
    backend = InstantBackend(
        model=args.served_model_name,
        spool_dir=args.spool_dir,
        num_layer_ids=args.num_layer_ids,
        hidden_size=args.hidden_size,
        answer_tokens=args.answer_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
        vary_rows=args.vary_rows,
        latency_s=args.latency_ms / 1000,
    )
    try:
        asyncio.run(serve(backend, args.host, args.port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()

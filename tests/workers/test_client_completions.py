"""``BackendClient.complete``: a raw text prompt to ``/v1/completions`` (``--chat false``).

The client against a local HTTP server answering as vLLM and as the embedded server do, then a
worker processing a text-prompt group against the bench's instant backend (real client, real
capture file, real store).
"""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hallulog.contracts import layout
from hallulog.contracts.jsonl import iter_rows
from hallulog.contracts.prompt_group import PromptGroup
from hallulog.workers.client import BackendClient
from hallulog.workers.worker import WorkerSpec

from tests.workers.worker_harness import process_group

REPO = Path(__file__).resolve().parents[2]

#: vLLM's CompletionResponse: prompt_token_ids and token_ids per choice; the chosen token added
#: to each top_logprobs dict (6 entries when it is not among the top 5)
VLLM_REPLY = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 0,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "text": " Paris",
            "finish_reason": "stop",
            "stop_reason": None,
            "prompt_token_ids": [11, 12, 13],
            "token_ids": [7, 8],
            "logprobs": {
                "text_offset": [0, 4],
                "tokens": [" Par", "is"],
                "token_logprobs": [-0.1, -3.0],
                "top_logprobs": [
                    {" Par": -0.1, " Lon": -2.5, " Rome": -4.0},
                    {"a": -0.5, "b": -1.0, "c": -1.5, "d": -2.0, "e": -2.5, "is": -3.0},
                ],
            },
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    "kv_transfer_params": {"hidden_states_path": "/spool/b.safetensors"},
}
#: the embedded server: prompt_token_ids top-level too, the raw logits as token_logits
EMBEDDED_REPLY = {
    **VLLM_REPLY,
    "prompt_token_ids": [11, 12, 13],
    "choices": [
        {
            **VLLM_REPLY["choices"][0],
            "logprobs": {**VLLM_REPLY["choices"][0]["logprobs"], "token_logits": [12.5, 3.25]},
        }
    ],
}


class _Server(BaseHTTPRequestHandler):
    reply: dict = VLLM_REPLY
    seen: list = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self.path, body))
        data = json.dumps(type(self).reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    _Server.seen = []
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _complete(url: str, capture: bool):
    async def go():
        client = BackendClient(url, "m", timeout=5, attempts=1)
        try:
            return await client.complete(
                "Q: Capital of France?\nA:",
                temperature=0.7,
                top_p=0.9,
                max_tokens=4,
                seed=5,
                capture=capture,
            )
        finally:
            await client.close()

    return asyncio.run(go())


@pytest.mark.parametrize("reply", [VLLM_REPLY, EMBEDDED_REPLY], ids=["vllm", "embedded"])
def test_complete_sends_a_text_prompt_and_reads_the_legacy_logprobs(server, reply):
    _Server.reply = reply
    comp = _complete(server, capture=True)
    path, sent = _Server.seen[-1]
    assert path == "/v1/completions"
    assert sent == {
        "model": "m",
        "prompt": "Q: Capital of France?\nA:",
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 4,
        "seed": 5,
        "n": 1,
        "logprobs": 5,
        "return_token_ids": True,
        "kv_transfer_params": {"include_output_tokens": True},
    }
    assert comp.text == " Paris" and comp.finish_reason == "stop"
    assert comp.prompt_token_ids == [11, 12, 13] and comp.token_ids == [7, 8]
    assert comp.hidden_states_path == "/spool/b.safetensors"
    assert comp.usage["completion_tokens"] == 2
    first, second = comp.logprobs
    assert first["token"] == " Par" and first["logprob"] == -0.1
    assert first["top_logprobs"] == [
        {"token": " Par", "logprob": -0.1},
        {"token": " Lon", "logprob": -2.5},
        {"token": " Rome", "logprob": -4.0},
    ]
    # sorted by logprob and cut to 5: the chosen token vLLM adds falls off, as in chat
    assert [t["token"] for t in second["top_logprobs"]] == ["a", "b", "c", "d", "e"]
    if reply is EMBEDDED_REPLY:
        assert first["logit"] == 12.5 and second["logit"] == 3.25
    else:
        assert "logit" not in first


def test_complete_without_capture_and_without_logprobs(server):
    _Server.reply = {
        **VLLM_REPLY,
        "kv_transfer_params": None,
        "choices": [{**VLLM_REPLY["choices"][0], "logprobs": None}],
    }
    comp = _complete(server, capture=False)
    assert "kv_transfer_params" not in _Server.seen[-1][1]
    assert comp.hidden_states_path is None and comp.logprobs == []
    assert comp.prompt_token_ids == [11, 12, 13]


# ---- a worker with a text-prompt group, against the instant backend -----------------------------


@pytest.fixture
def instant(tmp_path, instant_backend):
    spool = layout.spool_dir(tmp_path, 0)
    url = instant_backend(spool, num_layer_ids=2, hidden_size=8, answer_tokens=4)
    return url, tmp_path


def test_a_worker_sends_a_text_prompt_group_to_completions(instant):
    url, root = instant
    prompt = "Answer briefly.\n\nQ: 2+2?\nA: 4\n\nQ: Capital of France?\nA:"
    group = PromptGroup.create(
        "qa", "test", 0, [], reference={"value": "Paris", "aliases": ["Paris"]}, prompt=prompt
    )
    assert group.prompt_text == prompt and group.messages == []
    spec = WorkerSpec(
        worker_id=0,
        server_url=url,
        model_name="m",
        worker_dir=str(layout.worker_dir(root, 0)),
        storage_format="npy",
        layer_ids=(0, 1),
        hidden_size=8,
        sequence_mode="response",
        dtype="float16",
        capture_mode="generation",
        k_samples=1,
        primary_temperature=0.0,
        sample_temperature=0.7,
        sample_top_p=0.95,
        max_tokens=4,
        seed=0,
        groups_in_flight=1,
        request_timeout=5.0,
    )
    events = process_group(spec, group)
    assert [e["event"] for e in events] == ["done"], events
    assert events[0]["capture_errors"] == 0 and events[0]["generations"] == 2
    wdir = layout.worker_dir(root, 0)
    (row,) = list(iter_rows(wdir / layout.PROMPT_INDEX))
    assert row["prompt"] == prompt and row["messages"] == []
    assert row["prompt_token_ids"] == list(prompt.encode("utf-8")[:48])
    gens = list(iter_rows(wdir / layout.GENERATIONS))
    assert len(gens) == 2
    assert all(len(g["token_ids"]) == 4 and len(g["logprobs"]) == 4 for g in gens)
    assert all(len(t["top_logprobs"]) == 5 and "logit" in t for g in gens for t in g["logprobs"])
    assert len(list(iter_rows(wdir / layout.ACTIVATION_INDEX))) == 2


def test_chat_sends_the_template_kwargs_only_when_given():
    """The request body of a chat: ``chat_template_kwargs`` (vLLM's field) when the run has
    some, absent otherwise (servers that reject unknown fields see no change)."""
    import asyncio

    from hallulog.workers.client import BackendClient

    sent: list[dict] = []

    async def run(kwargs):
        client = BackendClient("http://127.0.0.1:9", "m", template_kwargs=kwargs)

        async def post(path, body):
            sent.append(body)
            return {"choices": [{"message": {"content": "Paris"}, "finish_reason": "stop"}]}

        client._post = post  # the HTTP exchange is the e2e tests' (tests/e2e/test_thinking_e2e.py)
        await client.chat(
            [{"role": "user", "content": "q"}],
            temperature=0.0,
            top_p=1.0,
            max_tokens=4,
            seed=0,
            capture=False,
        )
        await client.close()

    asyncio.run(run({"enable_thinking": False}))
    asyncio.run(run(None))
    assert sent[0]["chat_template_kwargs"] == {"enable_thinking": False}
    assert "chat_template_kwargs" not in sent[1]

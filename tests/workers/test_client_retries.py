"""tenacity owns the retries: 5xx/timeouts retried 3 times, other 4xx never."""

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hallulog.workers.client import BackendClient, BackendHTTPError

REPLY = {
    "id": "x",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "prompt_token_ids": [1, 2],
    "choices": [
        {
            "index": 0,
            "finish_reason": "stop",
            "token_ids": [7, 8],
            "message": {"role": "assistant", "content": "Paris"},
            "logprobs": {
                "content": [
                    {
                        "token": "Par",
                        "logprob": -0.1,
                        "bytes": None,
                        "logit": 12.5,
                        "top_logprobs": [{"token": "Par", "logprob": -0.1, "bytes": None}],
                    },
                    {
                        "token": "is",
                        "logprob": -0.2,
                        "bytes": None,
                        "top_logprobs": [{"token": "is", "logprob": -0.2, "bytes": None}],
                    },
                ]
            },
        }
    ],
    "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4},
    "kv_transfer_params": {"hidden_states_path": "/spool/a.safetensors"},
}


class _Scripted(BaseHTTPRequestHandler):
    script: list = []
    seen: list = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        status = type(self).script.pop(0) if type(self).script else 200
        payload = (
            REPLY if status == 200 else {"error": {"message": "boom", "type": "x", "code": status}}
        )
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    _Scripted.seen = []
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _chat(url):
    client = BackendClient(url, "m", timeout=5, backoff_base=0.01)

    async def go():
        try:
            return await client.chat(
                [{"role": "user", "content": "q"}],
                temperature=0.0,
                top_p=1.0,
                max_tokens=4,
                seed=1,
                capture=True,
            )
        finally:
            await client.close()

    return asyncio.run(go())


def test_5xx_is_retried_then_succeeds(server):
    _Scripted.script = [503, 500]
    comp = _chat(server)
    assert len(_Scripted.seen) == 3
    assert comp.text == "Paris" and comp.token_ids == [7, 8] and comp.prompt_token_ids == [1, 2]
    assert comp.hidden_states_path == "/spool/a.safetensors"
    assert comp.logprobs[0]["logit"] == 12.5 and "logit" not in comp.logprobs[1]
    sent = _Scripted.seen[-1]
    assert sent["kv_transfer_params"] == {"include_output_tokens": True}
    assert sent["return_token_ids"] is True and sent["top_logprobs"] == 5 and sent["n"] == 1


def test_gives_up_after_three_attempts(server):
    _Scripted.script = [500, 500, 500, 500]
    with pytest.raises(BackendHTTPError, match="HTTP 500 .*: boom") as info:
        _chat(server)
    assert len(_Scripted.seen) == 3 and info.value.status_code == 500


def test_the_waits_between_attempts_are_base_then_twice_base(server, monkeypatch):
    """The first attempt goes out without tenacity; the waits stay those of the policy."""
    waits, real_sleep = [], asyncio.sleep

    async def recording_sleep(delay, *args, **kwargs):
        if delay > 0:
            waits.append(round(delay, 4))
        return await real_sleep(delay, *args, **kwargs)

    monkeypatch.setattr(asyncio, "sleep", recording_sleep)
    _Scripted.script = [500, 500, 500]
    with pytest.raises(BackendHTTPError):
        _chat(server)
    assert waits == [0.01, 0.02]


def test_4xx_is_not_retried(server):
    _Scripted.script = [400]
    with pytest.raises(BackendHTTPError) as info:
        _chat(server)
    assert len(_Scripted.seen) == 1 and info.value.status_code == 400


def test_a_dead_server_is_retried_then_raises_a_connection_error():
    import socket

    from hallulog.workers.http import HTTPConnectionError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    with pytest.raises(HTTPConnectionError, match="cannot connect"):
        _chat(f"http://127.0.0.1:{port}")


def test_a_reply_with_non_finite_floats_still_parses():
    """Python servers write -Infinity/NaN (json.dumps allows them); orjson refuses: fallback."""
    from hallulog.contracts.jsonl import parse_line as _parse_json

    assert _parse_json(b'{"a": -Infinity, "b": [1.5]}')["a"] == float("-inf")
    assert _parse_json(b'{"a": 1e-05}') == {"a": 1e-05}
    with pytest.raises(ValueError):
        _parse_json(b'{"a": ')

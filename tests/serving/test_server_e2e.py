"""The real embedded server (SmolLM2-135M-Instruct, fp32) over HTTP."""

from __future__ import annotations

import concurrent.futures
import pathlib
import re

import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def chat(server, **kw):
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 8, "temperature": 0, **kw}
    resp = server.post("/v1/chat/completions", body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def batch_histogram(server) -> dict[float, float]:
    text = server.get("/metrics").text
    return {
        float(le): float(v)
        for le, v in re.findall(
            r'hallulog_serving_batch_size_bucket\{le="([^"]+)",[^}]*\} (\S+)', text
        )
        if le != "+Inf"
    }


def test_health_and_models(server):
    assert server.get("/health").status_code == 200
    models = server.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == MODEL


def test_server_process_maps_no_sklearn(server):
    maps = pathlib.Path(f"/proc/{server.proc.pid}/maps").read_text()
    assert "/torch/" in maps  # the check reads the right process
    for package in ("sklearn", "pandas", "pyarrow"):
        assert f"/{package}/" not in maps, package


def test_chat_logprobs_and_token_ids(server, reference):
    _, tokenizer = reference
    out = chat(server, logprobs=True, top_logprobs=5, return_token_ids=True)
    assert out["object"] == "chat.completion" and out["model"] == MODEL
    choice = out["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] in (
        "stop",
        "length",
    )
    ids, content = choice["token_ids"], choice["logprobs"]["content"]
    assert len(ids) == len(content) == out["usage"]["completion_tokens"] > 0
    prompt_ids = out["prompt_token_ids"]
    assert out["usage"]["prompt_tokens"] == len(prompt_ids)
    assert tokenizer.decode(prompt_ids).endswith(
        "What is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tokenizer.decode(ids, skip_special_tokens=True) == choice["message"]["content"]
    for token_id, entry in zip(ids, content):
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs", "logit"}
        assert entry["token"] == tokenizer.decode([token_id])
        assert entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == 5
        values = [t["logprob"] for t in entry["top_logprobs"]]
        assert values == sorted(values, reverse=True) and values[0] <= 0
        assert entry["top_logprobs"][0]["token"] == entry["token"]  # greedy
        assert abs(values[0] - entry["logprob"]) < 1e-6
    assert out["kv_transfer_params"] is None  # no capture asked for
    assert choice["message"]["reasoning"] is None  # no think tokens: nothing split out


def test_greedy_is_deterministic(server):
    a, b = chat(server, logprobs=True), chat(server, logprobs=True)
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    for x, y in zip(a["choices"][0]["logprobs"]["content"], b["choices"][0]["logprobs"]["content"]):
        assert abs(x["logprob"] - y["logprob"]) < 1e-4


def test_seeded_sampling(server):
    def sample(seed, n=1):
        out = chat(server, temperature=1.0, seed=seed, n=n, max_tokens=8)
        return [c["message"]["content"] for c in out["choices"]]

    assert sample(7) == sample(7)
    assert len({sample(seed)[0] for seed in (1, 2, 3, 4)}) > 1
    two = sample(11, n=2)
    assert len(two) == 2 and two[0] == sample(11)[0]  # child i uses seed + i, like vLLM


def test_stop_string_and_max_tokens(server):
    full = chat(server, max_tokens=12)["choices"][0]
    words = full["message"]["content"].split(" ")
    assert len(words) >= 3, full
    stop = " " + words[2]
    cut = chat(server, max_tokens=12, stop=[stop, "@@never@@"])["choices"][0]
    assert (
        cut["message"]["content"]
        == full["message"]["content"][: full["message"]["content"].index(stop)]
    )
    assert cut["finish_reason"] == "stop" and cut["stop_reason"] == stop

    resp = server.post(
        "/v1/completions",
        {
            "prompt": "Once upon a time",
            "max_tokens": 3,
            "temperature": 0,
            "logprobs": 5,
            "return_token_ids": True,
        },
    )
    out = resp.json()
    choice = out["choices"][0]
    assert out["object"] == "text_completion"
    assert len(choice["token_ids"]) == 3 and choice["finish_reason"] == "length"
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["token_logits"]) == 3
    assert lp["text_offset"][0] == 0 and all(len(t) >= 5 for t in lp["top_logprobs"])
    assert choice["prompt_token_ids"] == out["prompt_token_ids"]


def _check_capture(path, token_ids, model):
    data = load_file(path)
    states, ids = data["hidden_states"], data["token_ids"]
    n_layers = model.config.num_hidden_layers
    assert ids.dtype == torch.int64 and ids.tolist() == token_ids
    assert states.shape == (len(token_ids), n_layers + 1, model.config.hidden_size)
    assert states.dtype == torch.float32
    captured = {}
    hook = model.model.layers[-1].register_forward_hook(
        lambda _m, _i, out: captured.__setitem__(
            "pre_norm", out[0] if isinstance(out, tuple) else out
        )
    )
    try:
        with torch.no_grad():
            ref = model(ids[None], output_hidden_states=True).hidden_states
    finally:
        hook.remove()
    expected = [ref[k][0] for k in range(n_layers)] + [captured["pre_norm"][0]]
    for k, want in enumerate(expected):
        scale = want.abs().max().item()
        diff = (states[:, k] - want).abs().max().item()
        assert diff <= 1e-5 * scale + 1e-5, (k, diff, scale)
    return states


def test_capture_generation_and_prefill(server, reference):
    model, _ = reference
    out = chat(
        server,
        max_tokens=6,
        return_token_ids=True,
        kv_transfer_params={"include_output_tokens": True},
    )
    prompt_ids, gen_ids = out["prompt_token_ids"], out["choices"][0]["token_ids"]
    path = out["kv_transfer_params"]["hidden_states_path"]
    assert path.startswith(str(server.spool.resolve()))
    during = _check_capture(path, prompt_ids + gen_ids[:-1], model)

    # prefill-only: token ids prompt, max_tokens=1, no kv_transfer_params needed
    given = prompt_ids + gen_ids
    resp = server.post(
        "/v1/completions", {"model": MODEL, "prompt": given, "max_tokens": 1, "temperature": 0}
    )
    assert resp.status_code == 200, resp.text
    prefill = _check_capture(resp.json()["kv_transfer_params"]["hidden_states_path"], given, model)
    overlap = during.shape[0]
    assert (prefill[:overlap] - during).abs().max() <= 1e-5 * during.abs().max() + 1e-5


def test_concurrent_requests_are_batched(server):
    before = batch_histogram(server)
    prompts = [f"Count to {i}:" for i in range(6)]

    def one(prompt):
        return server.post("/v1/completions", {"prompt": prompt, "max_tokens": 4, "temperature": 0})

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(one, prompts))
    assert all(r.status_code == 200 for r in responses)
    after = batch_histogram(server)
    # buckets are cumulative: (top bucket - le=1) counts forward passes with more than one row
    bigger = (after[max(after)] - after[1.0]) - (before[max(before)] - before[1.0])
    assert bigger > 0, (before, after)
    text = server.get("/metrics").text
    for name in (
        "vllm:generation_tokens_total",
        "vllm:prompt_tokens_total",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
    ):
        assert name in text


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/chat/completions", {"messages": QUESTION, "temperature": -1}, 400),
        ("/v1/chat/completions", {"messages": QUESTION, "logprobs": True, "top_logprobs": 50}, 400),
        ("/v1/chat/completions", {"messages": []}, 400),
        ("/v1/completions", {"prompt": [99999999], "max_tokens": 1}, 400),
        ("/v1/completions", {"prompt": "x", "max_tokens": 100000}, 400),
        ("/v1/completions", {"prompt": "x", "model": "no-such-model"}, 404),
    ],
)
def test_error_envelope(server, path, body, status):
    resp = server.post(path, body)
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) >= {"message", "type", "code"} and err["code"] == status and err["message"]


def test_capture_with_n_is_the_last_choice(server):
    out = chat(
        server,
        temperature=1.0,
        seed=3,
        n=2,
        max_tokens=4,
        return_token_ids=True,
        kv_transfer_params={"include_output_tokens": True},
    )
    data = load_file(out["kv_transfer_params"]["hidden_states_path"])
    last = out["choices"][1]["token_ids"]
    assert data["token_ids"].tolist() == out["prompt_token_ids"] + last[:-1]

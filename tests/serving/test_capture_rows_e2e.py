"""Narrowed captures on the real embedded server (``kv_transfer_params.hallulog_capture_rows``,
contracts/capture_rows.py): the file holds only the positions asked for, bit for bit the rows of
a capture of every position, with their ``row0``; the worker stores the same activations from
them as from whole captures."""

from __future__ import annotations

import os

import pytest
import torch
from hallulog.contracts import layout
from hallulog.contracts.prompt_group import PromptGroup
from hallulog.workers.worker import WorkerSpec
from safetensors import safe_open

from tests.workers.worker_harness import stored_activations

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _take(path: str) -> tuple[dict, torch.Tensor, list[int]]:
    """A capture file's metadata, hidden states and token ids; the file is deleted."""
    with safe_open(path, "pt") as f:
        out = f.metadata() or {}, f.get_tensor("hidden_states"), f.get_tensor("token_ids").tolist()
    for leftover in (path, path + ".lock"):
        os.unlink(leftover)
    return out


def _chat(server, rows=None) -> tuple[list[int], list[int], str]:
    kv = {"include_output_tokens": True}
    if rows is not None:
        kv["hallulog_capture_rows"] = rows
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 6, "temperature": 0}
    resp = server.post(
        "/v1/chat/completions", {**body, "return_token_ids": True, "kv_transfer_params": kv}
    )
    assert resp.status_code == 200, resp.text
    out = resp.json()
    ids = out["choices"][0]["token_ids"]
    return out["prompt_token_ids"], ids, out["kv_transfer_params"]["hidden_states_path"]


def test_each_selection_holds_those_rows_of_the_whole_capture(server):
    prompt, answer, path = _chat(server)
    meta, whole, ids = _take(path)
    p, n = len(prompt), len(prompt) + len(answer) - 1
    assert meta == {"row0": "0"} and ids == prompt + answer[:-1] and whole.shape[0] == n
    for rows, (start, stop) in {
        "all": (0, n),
        "prompt": (0, p),
        "response": (p - 1, n),
        "last": (n - 1, n),
        p + 2: (p + 2, n),
        10_000: (n - 1, n),
    }.items():
        prompt_again, answer_again, path = _chat(server, rows)
        assert (prompt_again, answer_again) == (prompt, answer)
        meta, hidden, got_ids = _take(path)
        assert meta == {"row0": str(start)}, rows
        assert got_ids == ids[start:stop], rows
        assert torch.equal(hidden, whole[start:stop]), rows


def test_a_prefill_only_request_starts_where_it_is_asked(server):
    prompt, answer, path = _chat(server)
    _take(path)
    given = prompt + answer
    body = {"model": MODEL, "prompt": given, "max_tokens": 1, "temperature": 0}
    files = {}
    for rows in (None, len(prompt) - 1, "last"):
        kv = {} if rows is None else {"kv_transfer_params": {"hallulog_capture_rows": rows}}
        resp = server.post("/v1/completions", {**body, **kv})
        assert resp.status_code == 200, resp.text
        files[rows] = _take(resp.json()["kv_transfer_params"]["hidden_states_path"])
    _, whole, ids = files[None]
    assert ids == given
    for rows, start in ((len(prompt) - 1, len(prompt) - 1), ("last", len(given) - 1)):
        meta, hidden, got_ids = files[rows]
        assert meta == {"row0": str(start)} and got_ids == given[start:]
        assert torch.equal(hidden, whole[start:])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_a_capture_in_the_stored_dtype_holds_the_rows_cast(server, dtype):
    """``hallulog_capture_dtype`` (contracts/capture_dtype.py): the rows of the model-dtype
    capture, cast by torch (round to nearest even), in a file of that dtype."""
    _, _, path = _chat(server, "response")
    _, whole, ids = _take(path)
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 6, "temperature": 0}
    kv = {"include_output_tokens": True, "hallulog_capture_rows": "response"}
    kv["hallulog_capture_dtype"] = dtype
    resp = server.post("/v1/chat/completions", {**body, "kv_transfer_params": kv})
    assert resp.status_code == 200, resp.text
    _, hidden, got_ids = _take(resp.json()["kv_transfer_params"]["hidden_states_path"])
    assert got_ids == ids and hidden.dtype == getattr(torch, dtype)
    assert torch.equal(hidden.view(torch.uint8), whole.to(hidden.dtype).view(torch.uint8))


def test_a_bad_capture_dtype_is_refused(server):
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 2}
    kv = {"include_output_tokens": True, "hallulog_capture_dtype": "int8"}
    resp = server.post("/v1/chat/completions", {**body, "kv_transfer_params": kv})
    assert resp.status_code == 400 and "hallulog_capture_dtype" in resp.text


@pytest.mark.parametrize("bad", ["tbg", -2, 1.5])
def test_a_bad_selection_is_refused(server, bad):
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 2}
    kv = {"include_output_tokens": True, "hallulog_capture_rows": bad}
    resp = server.post("/v1/chat/completions", {**body, "kv_transfer_params": kv})
    assert resp.status_code == 400 and "hallulog_capture_rows" in resp.text


@pytest.mark.parametrize(
    ("sequence_mode", "positions", "capture_mode"),
    [
        ("response", None, "generation"),  # integrated
        ("last", None, "generation"),  # light
        ("positions", ("tbg", "slt", "exact_answer", "last"), "generation"),  # probes
        ("response", None, "prefill"),
        ("all", None, "generation"),
    ],
)
def test_the_worker_stores_the_same_activations(
    server, tmp_path, sequence_mode, positions, capture_mode
):
    """One request per group (K = 0, greedy): the server computes the same rows for both runs,
    so the stored activations must be bit for bit those stored from a whole capture."""
    group = PromptGroup.create(
        "triviaqa",
        "dev",
        0,
        QUESTION,
        reference={"value": "Paris", "aliases": ["Paris"]},
    )

    def spec(name: str) -> WorkerSpec:
        return WorkerSpec(
            worker_id=0,
            server_url=server.base_url,
            model_name=MODEL,
            worker_dir=str(layout.worker_dir(tmp_path / name, 0)),
            storage_format="packed",
            layer_ids=tuple(range(31)),
            hidden_size=576,
            sequence_mode=sequence_mode,
            dtype="float16",
            capture_mode=capture_mode,
            k_samples=0,
            primary_temperature=0.0,
            sample_temperature=0.7,
            sample_top_p=0.95,
            max_tokens=8,
            seed=0,
            groups_in_flight=1,
            request_timeout=120.0,
            positions=positions,
        )

    narrow = stored_activations(spec("narrow"), group)
    # every position, in the model dtype: what a server that ignores both fields writes
    whole = stored_activations(spec("whole"), group, capture_rows="all", model_dtype_capture=True)
    assert narrow.keys() == whole.keys() and len(narrow) == 1
    for key, (fields, layers) in narrow.items():
        assert fields == whole[key][0]
        assert fields["num_rows"] >= 1
        for got, want in zip(layers, whole[key][1]):
            assert got.tobytes() == want.tobytes()

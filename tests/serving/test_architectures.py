"""The embedded server on the model families researchers study, each a small random-weight model
built from its transformers config and saved with the default model's tokenizer: greedy tokens
equal transformers' ``generate``, and every captured layer id equals transformers'
``output_hidden_states`` (ids 0..N-1; id N is the last decoder layer before the final norm, so
the family's final norm of it is transformers' last entry). Mistral and Gemma run with a sliding
window shorter than the prompts; Qwen3's prompts are its thinking template rendered with
``enable_thinking`` on and off."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import time

import httpx
import pytest
import torch
from safetensors.torch import load_file

from tests.serving.conftest import REPO, free_port

pytestmark = pytest.mark.e2e

MAX_TOKENS = 8
STARTUP_S = 240
# A Qwen3-style template: the assistant turn opens with an empty think block when thinking is off.
THINK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    max_position_embeddings=256,
    initializer_range=0.2,  # logits far apart: greedy choices are not float ties
)
GQA = dict(num_key_value_heads=2)
LOCAL = ["sliding_attention", "full_attention", "sliding_attention"]
FAMILIES = {
    "llama": ("LlamaConfig", GQA, "norm"),
    "qwen2": ("Qwen2Config", GQA, "norm"),
    "qwen3": ("Qwen3Config", {**GQA, "head_dim": 16}, "norm"),
    "gemma3": (
        "Gemma3TextConfig",
        {**GQA, "head_dim": 16, "sliding_window": 8, "layer_types": LOCAL},
        "norm",
    ),
    "mistral": ("MistralConfig", {**GQA, "sliding_window": 8}, "norm"),
    "gpt_neox": ("GPTNeoXConfig", {}, "final_layer_norm"),
}


def _build(root, tokenizer):
    import transformers

    paths = {}
    for name, (config_class, extra, _) in FAMILIES.items():
        config = getattr(transformers, config_class)(
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.bos_token_id,
            **COMMON,
            **extra,
        )
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        paths[name] = root / name
        model.save_pretrained(paths[name])
        if name == "qwen3":
            tokenizer.chat_template, saved = THINK_TEMPLATE, tokenizer.chat_template
            tokenizer.save_pretrained(paths[name])
            tokenizer.chat_template = saved
        else:
            tokenizer.save_pretrained(paths[name])
    return paths


def _start(path, spool, log):
    port = free_port()
    cmd = [sys.executable, "-m", "hallulog.serving", "--model", str(path), "--port", str(port)]
    cmd += ["--spool-dir", str(spool), "--num-threads", "1", "--batch-wait-ms", "50"]
    cmd += ["--log-level", "warning"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def _wait(proc, base, log, deadline):
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"server not healthy:\n{log.read_text()[-3000:]}")
        time.sleep(0.3)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Every family's model, built once, each served by its own server (started together)."""
    from hallulog.serving import default_model_dir
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("families")
    paths = _build(root, AutoTokenizer.from_pretrained(default_model_dir()))
    procs = {
        name: _start(path, root / f"spool-{name}", root / f"{name}.log")
        for name, path in paths.items()
    }
    try:
        deadline = time.monotonic() + STARTUP_S
        for name, (proc, base) in procs.items():
            _wait(proc, base, root / f"{name}.log", deadline)
        yield {name: (paths[name], procs[name][1]) for name in paths}
    finally:
        for proc, _ in procs.values():
            proc.terminate()
        for proc, _ in procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _prompts(name, tokenizer):
    if name != "qwen3":
        texts = ["The capital of France is a city called", "One two three four five six seven"]
        return [tokenizer(t)["input_ids"] for t in texts]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    rendered = {
        on: tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, enable_thinking=on
        )
        for on in (True, False)
    }
    assert "<think>\n\n</think>" in rendered[False] and "<think>" not in rendered[True]
    return [tokenizer(rendered[on], add_special_tokens=False)["input_ids"] for on in (True, False)]


def _complete(base, prompt):
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "return_token_ids": True}
    body["kv_transfer_params"] = {"include_output_tokens": True}
    resp = httpx.post(base + "/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    return out["choices"][0]["token_ids"], out["kv_transfer_params"]["hidden_states_path"]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_serves_and_captures_like_transformers(servers, name):
    from hallulog.serving.capture import decoder_layers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, base = servers[name]
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = _prompts(name, tokenizer)
    assert max(len(p) for p in prompts) + MAX_TOKENS > 8  # past Mistral's and Gemma's window
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:  # batched, left-padded
        answers = list(pool.map(lambda p: _complete(base, p), prompts))
    final_norm = getattr(model.base_model, FAMILIES[name][2])
    worst = 0.0
    for prompt, (tokens, capture) in zip(prompts, answers):
        with torch.no_grad():
            want = model.generate(
                torch.tensor([prompt]),
                do_sample=False,
                max_new_tokens=MAX_TOKENS,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )[0, len(prompt) :].tolist()
        assert tokens == want, name
        fed = prompt + tokens[:-1]
        last = {}
        hook = decoder_layers(model)[-1].register_forward_hook(
            lambda _m, _i, out, last=last: last.__setitem__(
                "x", out[0] if isinstance(out, tuple) else out
            )
        )
        try:
            with torch.no_grad():
                ref = model(torch.tensor([fed]), output_hidden_states=True).hidden_states
        finally:
            hook.remove()
        data = load_file(capture)
        states = data["hidden_states"]
        assert data["token_ids"].tolist() == fed
        expected = [layer[0] for layer in ref[:-1]] + [last["x"][0]]
        assert states.shape == (len(fed), len(expected), model.config.hidden_size)
        for k, layer in enumerate(expected):
            diff = (states[:, k] - layer).abs().max().item()
            assert diff <= 1e-5 * layer.abs().max().item() + 1e-5, (name, k, diff)
            worst = max(worst, diff)
        with torch.no_grad():  # transformers' last entry is after the final norm
            torch.testing.assert_close(final_norm(last["x"][0]), ref[-1][0])
    print(f"{name}: max abs difference {worst:.1e}")

"""A reasoning test model built from the default SmolLM2 weights (real weights, deterministic).

The tokenizer gains the added (not special) tokens ``<think>`` and ``</think>`` and a
Qwen3-style chat template: ``enable_thinking`` false ends the prompt with an empty
``<think>\\n\\n</think>\\n\\n`` block; true (the default) opens the block, ``<think>\\n``,
as the DeepSeek-R1 distills' templates do, so the model starts in its reasoning.

The new rows of the tied embedding/lm_head matrix: ``</think>`` gets the row of a token the model
emits often scaled up by :data:`CLOSE_SCALE`, so wherever that token would win with a positive
logit ``</think>`` wins instead and the reasoning closes (``closes=True``); the other variant
gives ``</think>`` a zero row (logit 0, below the winning token's), so the reasoning never closes.
"""

from __future__ import annotations

import pathlib

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CLOSE_SCALE = 1.05
#: the token whose row ``</think>`` takes (SmolLM2 ends most of its sentences with it)
CLOSE_LIKE = "."

TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% else %}{{ '<think>\\n' }}{% endif %}{% endif %}"
)


def build_thinking_model(out: pathlib.Path, *, closes: bool = True) -> pathlib.Path:
    """Write the test model to ``out`` (a local HF model directory) and return it."""
    import torch
    from hallulog.serving.model_loader import default_model_dir
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (out / "config.json").exists():
        return out
    src = default_model_dir()
    tok = AutoTokenizer.from_pretrained(src)
    tok.add_tokens([THINK_OPEN, THINK_CLOSE])
    tok.chat_template = TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    emb = model.get_input_embeddings().weight
    like = tok.convert_tokens_to_ids(tok.tokenize(CLOSE_LIKE))[0]
    open_id, close_id = tok.convert_tokens_to_ids([THINK_OPEN, THINK_CLOSE])
    with torch.no_grad():
        emb[open_id] = 0.0  # never emitted: the template writes it
        emb[close_id] = emb[like] * CLOSE_SCALE if closes else 0.0
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out

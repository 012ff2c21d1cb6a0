"""A tiny random Llama and a fake tokenizer, so engine and capture tests need no real model."""

from __future__ import annotations

import pathlib

import torch
from hallulog.serving.model_loader import LoadedModel

VOCAB = 64
EOS = 1
PAD = 0


class FakeTokenizer:
    """Token i decodes to ``"<i>"``; EOS decodes to ``""`` when special tokens are skipped."""

    pad_token_id = PAD
    eos_token_id = EOS

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join("" if (skip_special_tokens and i in (PAD, EOS)) else f"<{i}>" for i in ids)


def tiny_model(seed: int = 0, layers: int = 2, head_dim: int | None = None) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=2,
        **({"head_dim": head_dim} if head_dim else {}),
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def tiny_loaded(
    eos: frozenset[int] = frozenset({EOS}), max_model_len: int = 128, head_dim: int | None = None
) -> LoadedModel:
    """``head_dim`` 16: wide enough for the decode-attention kernel (the default 8 is not)."""
    return LoadedModel(
        model=tiny_model(head_dim=head_dim),
        tokenizer=FakeTokenizer(),
        path=pathlib.Path("tiny"),
        dtype=torch.float32,
        eos_token_ids=eos,
        max_model_len=max_model_len,
    )

"""A fused decode step for Llama-style models over the engine's ``SlotKVCache``.

One decode step of transformers' ``LlamaForCausalLM`` is 211 matrix products among ~6,500
profiler events, through ``nn.Module`` calls, mask building and cache bookkeeping; the matrix
products are ~75-80 % of its CPU time (docs/serving.md, "Profile of a decode step").
``FusedDecoder`` runs the same arithmetic with fewer ops (121 matrix products, ~5,000
events): the query/key/value projections as one matrix product and the gate/up projections as
another (the weights concatenated once at start-up, the modules' weights made views of them;
every output element is still the same dot product), rotary embedding of queries and keys in
one pass with the model's own ``rotary_emb``, keys and values written in place into the slot
cache, one fused ``scaled_dot_product_attention`` over the live columns with the slot mask, and
logits of the last token only.

The hidden states of the captured layer ids are returned from the step itself (id 0 is the
embedding output, id k the residual stream after decoder layer k), so capture needs no hooks
here. Prefill stays on the model's own forward (its cost is in the matrix products).

Used only when ``supports_fused_decode`` accepts the model: Llama layout, no biases, SiLU MLP,
full attention, the model's rotary embedding. Anything else decodes through transformers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

__all__ = ["FusedDecoder", "supports_fused_decode"]


def supports_fused_decode(model: torch.nn.Module) -> bool:
    """True for a plain Llama: the layout and arithmetic ``FusedDecoder`` reproduces."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) != "llama":
        return False
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        return False
    if getattr(config, "pretraining_tp", 1) != 1 or getattr(config, "hidden_act", "silu") != "silu":
        return False
    base = getattr(model, "model", None)
    return all(hasattr(base, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb"))


class _Layer:
    __slots__ = ("ln1", "eps1", "qkv", "o", "ln2", "eps2", "gate_up", "down")

    def __init__(self, layer: torch.nn.Module):
        attn, mlp = layer.self_attn, layer.mlp
        self.ln1, self.eps1 = layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon
        self.ln2 = layer.post_attention_layernorm.weight
        self.eps2 = layer.post_attention_layernorm.variance_epsilon
        self.qkv = _fuse(attn.q_proj, attn.k_proj, attn.v_proj)
        self.o = attn.o_proj.weight
        self.gate_up = _fuse(mlp.gate_proj, mlp.up_proj)
        self.down = mlp.down_proj.weight


def _fuse(*linears: torch.nn.Linear) -> torch.Tensor:
    """One ``[sum(out), in]`` weight; each module's weight becomes a view of its rows, so the
    model's own forward (prefill) reads the same memory and no weight is held twice."""
    fused = torch.cat([linear.weight.detach() for linear in linears])
    start = 0
    for linear in linears:
        rows = linear.weight.shape[0]
        linear.weight.data = fused[start : start + rows]
        start += rows
    return fused


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``LlamaRMSNorm`` (float32 statistics, then cast back and scaled)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class FusedDecoder:
    """One decode step (one token per row) of a Llama model; see the module docstring."""

    def __init__(self, model: torch.nn.Module, capture_layer_ids: Sequence[int] | None = None):
        config = model.config
        base = model.model
        self.embed = base.embed_tokens.weight
        self.rotary = base.rotary_emb
        self.norm, self.norm_eps = base.norm.weight, base.norm.variance_epsilon
        self.lm_head = model.get_output_embeddings().weight
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scaling = self.head_dim**-0.5
        self.intermediate = config.intermediate_size
        self.layers = [_Layer(layer) for layer in base.layers]
        self.capture_layer_ids = list(capture_layer_ids or [])

    @torch.inference_mode()
    def step(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache,
        mask: torch.Tensor,
        capture: bool,
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """Logits ``[rows, vocab]`` (float32) of one token per row, and when ``capture`` the
        hidden states ``[rows, 1, hidden]`` of each captured layer id (in their order).

        ``input_ids``/``positions`` are ``[rows, 1]``; ``mask`` is ``cache.step_mask(1)``
        (``[rows, columns + 1]``, True = a real token); the step writes column ``cache.hi`` of
        every layer, and the caller then calls ``cache.advance(1)``.
        """
        rows = input_ids.shape[0]
        h = F.embedding(input_ids, self.embed)  # [rows, 1, hidden]
        wanted = set(self.capture_layer_ids) if capture else ()
        states: dict[int, torch.Tensor] = {}
        if 0 in wanted:
            states[0] = h
        cos, sin = self.rotary(h, positions)  # [rows, 1, head_dim]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # broadcast over heads
        half = self.head_dim // 2
        attn_mask = mask[:, None, None, :]  # [rows, 1, 1, columns]
        q_width = self.heads * self.head_dim
        kv_width = self.kv_heads * self.head_dim
        lo, hi = cache.lo, cache.hi
        gqa = self.heads != self.kv_heads
        for index, (layer, slot) in enumerate(zip(self.layers, cache.layers)):
            x = _rms_norm(h, layer.ln1, layer.eps1)
            qkv = F.linear(x, layer.qkv)  # [rows, 1, q + 2 kv]
            qk = (
                qkv[..., : q_width + kv_width]
                .view(rows, 1, self.heads + self.kv_heads, self.head_dim)
                .transpose(1, 2)
            )
            rotated = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
            qk = qk * cos + rotated * sin
            q = qk[:, : self.heads]
            slot.keys[:rows, :, hi : hi + 1] = qk[:, self.heads :]
            slot.values[:rows, :, hi : hi + 1] = (
                qkv[..., q_width + kv_width :]
                .view(rows, 1, self.kv_heads, self.head_dim)
                .transpose(1, 2)
            )
            keys = slot.keys[:rows, :, lo : hi + 1]
            values = slot.values[:rows, :, lo : hi + 1]
            out = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=attn_mask, scale=self.scaling, enable_gqa=gqa
            )
            h = h + F.linear(out.transpose(1, 2).reshape(rows, 1, q_width), layer.o)
            x = _rms_norm(h, layer.ln2, layer.eps2)
            gate_up = F.linear(x, layer.gate_up)
            gate, up = gate_up[..., : self.intermediate], gate_up[..., self.intermediate :]
            h = h + F.linear(F.silu(gate) * up, layer.down)
            if index + 1 in wanted:
                states[index + 1] = h
        logits = F.linear(_rms_norm(h, self.norm, self.norm_eps)[:, -1], self.lm_head)
        captured = [states[i] for i in self.capture_layer_ids] if capture else None
        return logits.float(), captured

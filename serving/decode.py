"""A fused forward pass for Llama-style models: the engine's prefill and decode steps.

transformers' ``LlamaForCausalLM`` runs a decode step as 211 matrix products among ~6,500
profiler events, through ``nn.Module`` calls, mask building and cache bookkeeping.
``FusedDecoder`` runs the same arithmetic with fewer ops: the query/key/value projections as one
matrix product and the gate/up projections as another (the weights concatenated once at
start-up, the modules' weights made views of them; every output element is still the same dot
product), rotary embedding of queries and keys in one pass with the model's own
``rotary_emb``, and logits of the last token only.

- Matrix products go through oneDNN with the weights packed once into its blocked layout
  (``torch.ops.mkldnn._linear_pointwise``), where torch has oneDNN and the model is float32:
  on the CPUs measured (docs/serving.md, "Profile of a decode step") it runs this model's
  shapes at 2-3x the rate of the default ``F.linear`` (MKL), at every row count. Still float32
  with float32 accumulation: results differ from ``F.linear`` by rounding only (~1e-6
  relative), and a row's result does not depend on the other rows (nor on the intra-op
  threads). The packed copies are a second copy of the matrix weights until
  :meth:`FusedDecoder.release_model_weights` drops the plain ones (the server does: the
  model's own forward is not used on this path).
- ``step``: one token per row over the engine's ``SlotKVCache``; keys and values are written in
  place; attention is the C kernel of ``hallulog.serving.attention_kernel`` over each row's own
  columns (where it could be built; the rows cut in as many blocks as the engine has intra-op
  threads), else two batched matrix products over the live columns with the slot mask as an
  additive bias.
- ``prefill``: the prompts of joining sequences (left-padded, explicit positions) on their own;
  their keys and values are returned for the engine to place into the slot cache.
- ``forward``: both in one pass (every matrix product takes the step's rows and the prompts'
  tokens; attention apart), so prompts joining a running batch cost no pass over the weights of
  their own.
- Capture: the residual stream of the captured layer ids is written by the step itself into one
  ``[rows, tokens, layer_ids, hidden]`` buffer (id 0 is the embedding output, id k the residual
  stream after decoder layer k), so a sequence's rows are one copy away from its capture buffer.

Used only when ``supports_fused_decode`` accepts the model: Llama layout, no biases, SiLU MLP,
full attention, the model's rotary embedding. Anything else runs through transformers.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from hallulog.serving.attention_capture import column_positions, prefill_row
from hallulog.serving.attention_kernel import decode_attention, kernel_fits, load_kernel
from hallulog.serving.mapped_weights import map_weight
from hallulog.serving.memory import release_freed_memory

__all__ = ["FusedDecoder", "supports_fused_decode", "packed_linear_available"]

PACK_ROWS = 64  # oneDNN's layout hint (the rows it tunes for); any row count runs on it


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


def packed_linear_available(dtype: torch.dtype = torch.float32) -> bool:
    """oneDNN's packed float32 linear: present, and equal to ``F.linear`` up to rounding."""
    if dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    if not (hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")):
        return False
    try:
        generator = torch.Generator().manual_seed(0)
        weight = torch.randn(48, 32, generator=generator)
        x = torch.randn(5, 32, generator=generator)
        packed = ops._reorder_linear_weight(weight, PACK_ROWS)
        y = ops._linear_pointwise(x, packed, None, "none", [None], "")
        return torch.allclose(y, F.linear(x, weight), rtol=1e-5, atol=1e-5)
    except (RuntimeError, NotImplementedError):
        return False


class _Linear:
    """``x @ weight.T``: oneDNN on a packed copy of ``weight``, or ``F.linear``."""

    __slots__ = ("weight", "packed")

    def __init__(self, weight: torch.Tensor, pack: bool):
        self.weight = weight
        self.packed = (
            torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS) if pack else None
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self.weight)
        flat = x.reshape(-1, x.shape[-1])
        y = torch.ops.mkldnn._linear_pointwise(flat, self.packed, None, "none", [None], "")
        return y.view(*x.shape[:-1], y.shape[-1])


class _Layer:
    __slots__ = ("ln1", "eps1", "qkv", "o", "ln2", "eps2", "gate_up", "down")

    def __init__(self, layer: torch.nn.Module, pack: bool):
        attn, mlp = layer.self_attn, layer.mlp
        self.ln1, self.eps1 = layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon
        self.ln2 = layer.post_attention_layernorm.weight
        self.eps2 = layer.post_attention_layernorm.variance_epsilon
        self.qkv = _Linear(_fuse(attn.q_proj, attn.k_proj, attn.v_proj), pack)
        self.o = _Linear(attn.o_proj.weight, pack)
        self.gate_up = _Linear(_fuse(mlp.gate_proj, mlp.up_proj), pack)
        self.down = _Linear(mlp.down_proj.weight, pack)

    def linears(self) -> tuple[_Linear, ...]:
        return self.qkv, self.o, self.gate_up, self.down


def _fuse(*linears: torch.nn.Linear) -> torch.Tensor:
    """One ``[sum(out), in]`` weight; each module's weight becomes a view of its rows, so the
    model's own forward reads the same memory and no weight is held twice."""
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
    """Prefill and decode steps of a Llama model; see the module docstring."""

    def __init__(
        self,
        model: torch.nn.Module,
        capture_layer_ids: Sequence[int] | None = None,
        *,
        packed: bool | None = None,
        attention_kernel: bool | None = None,
    ):
        """``packed``/``attention_kernel``: use oneDNN's packed products / the C attention
        kernel (``hallulog.serving.attention_kernel``); None: where available."""
        config = model.config
        base = model.model
        self._model = model
        dtype = base.embed_tokens.weight.dtype
        self.packed = packed_linear_available(dtype) if packed is None else packed
        self.embed = base.embed_tokens.weight
        self.rotary = base.rotary_emb
        self.norm, self.norm_eps = base.norm.weight, base.norm.variance_epsilon
        self.lm_head = _Linear(model.get_output_embeddings().weight, self.packed)
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scaling = self.head_dim**-0.5
        self.intermediate = config.intermediate_size
        self.layers = [_Layer(layer, self.packed) for layer in base.layers]
        self.capture_layer_ids = list(capture_layer_ids or [])
        groups = self.heads // self.kv_heads
        self.kernel = None
        if attention_kernel is not False and kernel_fits(self.head_dim, groups, dtype):
            self.kernel = load_kernel()
            if attention_kernel and self.kernel is None:
                raise RuntimeError("the C attention kernel could not be built (see the log)")
        self._slot = {layer_id: i for i, layer_id in enumerate(self.capture_layer_ids)}

    def release_model_weights(self, checkpoint: pathlib.Path | None = None) -> int:
        """Keep the matrices only in oneDNN's packed layout: the model's own linear weights
        become meta tensors (its own forward can no longer run; the decoder, its hooks-free
        capture and ``HiddenStateRecorder`` need none of them) and the weights still used in
        their plain layout (norms) are copied out of the loader's file mapping, so that the
        mapping is let go. The embedding, where ``checkpoint`` (the model directory) holds it
        as loaded, is read from a mapping of its own pages instead
        (``hallulog.serving.mapped_weights``): only the rows of the tokens fed are resident.
        Returns the bytes of plain weights dropped (0 without packed products: then every
        weight is still needed)."""
        if not self.packed:
            return 0
        model = self._model
        mapped = None
        if checkpoint is not None:
            name = next(n for n, p in model.named_parameters() if p is self.embed)
            mapped = map_weight(checkpoint, name, self.embed)
        keep = {id(self.embed)}  # the tied output head is the embedding: still read plain
        dropped = 0
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and id(module.weight) not in keep:
                dropped += module.weight.numel() * module.weight.element_size()
                module.weight = torch.nn.Parameter(
                    torch.empty(module.weight.shape, dtype=module.weight.dtype, device="meta"),
                    requires_grad=False,
                )
        for linear in (*(lin for layer in self.layers for lin in layer.linears()), self.lm_head):
            linear.weight = None
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.device.type != "meta" and tensor is not self.embed:
                tensor.data = tensor.data.clone()  # off the file mapping, if it was on one
        if mapped is not None:
            dropped += self.embed.numel() * self.embed.element_size()
            self.embed.data = mapped
        else:
            self.embed.data = self.embed.data.clone()
        release_freed_memory()
        return dropped

    # ---- entry points -----------------------------------------------------------------------

    @torch.inference_mode()
    def step(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache,
        mask: torch.Tensor,
        capture: bool,
        summaries=None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits ``[rows, vocab]`` (float32) of one token per row, and when ``capture`` the
        captured states ``[rows, 1, layer_ids, hidden]``.

        ``input_ids``/``positions`` are ``[rows, 1]``; ``mask`` is ``cache.step_mask(1)``
        (``[rows, columns + 1]``, True = a real token); the step writes column ``cache.hi`` of
        every layer, and the caller then calls ``cache.advance(1)``. ``summaries``: a
        ``StepSummaries`` that takes the step's attention summaries (None: none).
        """
        step = (input_ids, positions, cache, mask)
        logits, states, *_ = self.forward(capture, step=step, summaries=(summaries, None))
        return logits, states

    @torch.inference_mode()
    def prefill(
        self, input_ids, mask, positions, capture: bool, summaries=None
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor | None]:
        """Left-padded prompts ``[rows, width]`` (``mask``: 1 = a real token) on their own.

        Returns the logits of the last position ``[rows, vocab]`` (float32), every layer's keys
        and values ``[rows, kv_heads, width, head_dim]``, and when ``capture`` the captured
        states ``[rows, width, layer_ids, hidden]`` (padding positions hold garbage).
        ``summaries``: a ``StepSummaries`` for the attention summaries of the last positions.
        """
        prefill = (input_ids, mask, positions)
        _, _, logits, kv, states = self.forward(
            capture, prefill=prefill, summaries=(None, summaries)
        )
        return logits, kv, states

    @torch.inference_mode()
    def forward(self, capture: bool, *, step=None, prefill=None, summaries=(None, None)):
        """A decode step (``step``: the arguments of :meth:`step` but ``capture``) and a prefill
        (``prefill``: those of :meth:`prefill`) in one pass: every matrix product takes the
        tokens of both, so the weights are read once for the two (prompts joining a running
        batch cost no pass of their own); ``summaries``: the step's and the prefill's
        ``StepSummaries`` (or None each). Returns ``(step logits, step states, prefill logits,
        prefill keys/values, prefill states)``, None for a part not given."""
        ids, positions, parts = [], [], []
        rows = prompts = width = 0
        if step is not None:
            step_ids, step_positions, cache, mask = step
            rows = step_ids.shape[0]
            ids.append(step_ids.reshape(-1))
            positions.append(step_positions.reshape(-1))
            parts.append((rows, self._step_attention(rows, cache, mask, summaries[0])))
        kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        if prefill is not None:
            prefill_ids, prefill_mask, prefill_positions = prefill
            prompts, width = prefill_ids.shape
            ids.append(prefill_ids.reshape(-1))
            positions.append(prefill_positions.reshape(-1))
            attention = self._prefill_attention(prefill_mask, kv, summaries[1])
            parts.append((prompts * width, attention))
        ids = ids[0] if len(ids) == 1 else torch.cat(ids)
        positions = positions[0] if len(positions) == 1 else torch.cat(positions)

        def attend(index, query, key, value):  # [tokens, heads, 1, head_dim], ...
            outs, at = [], 0
            for count, part in parts:
                outs.append(part(index, *(t[at : at + count] for t in (query, key, value))))
                at += count
            return outs[0] if len(outs) == 1 else torch.cat(outs)

        last = None  # the positions whose logits are wanted: every step row, each prompt's last
        if prompts:
            ends = torch.arange(1, prompts + 1) * width - 1 + rows
            last = torch.cat((torch.arange(rows), ends)) if rows else ends
        logits, states = self._forward(ids[:, None], positions[:, None], attend, capture, last)
        step_out = (
            (logits[:rows], None if states is None else states[:rows]) if rows else (None,) * 2
        )
        if not prompts:
            return (*step_out, None, None, None)
        prefill_states = None
        if states is not None:
            prefill_states = states[rows:].view(prompts, width, *states.shape[2:])
        return (*step_out, logits[rows:], kv, prefill_states)

    def _step_attention(self, rows: int, cache, mask: torch.Tensor, summaries=None):
        """Attention of one token per running row over the slot cache (writes column ``hi``),
        after the row's prompt in the cache's prefix store when it has one; its summaries to
        ``summaries`` when given."""
        lo, hi = cache.lo, cache.hi
        groups = self.heads // self.kv_heads
        shared = getattr(cache, "prefix", None) is not None
        if shared:
            entry, length = cache.prefix_of_rows()
        kernel, parts = self.kernel, torch.get_num_threads()  # the kernel's rows in parts
        if kernel is not None:  # a row's tokens are its columns from the first real one to hi
            start = mask.to(torch.uint8).argmax(dim=1) + lo
        else:  # [rows, 1, 1, columns]: every query head of a row
            if shared:  # the prompt's columns (padded to the longest) come first
                columns = cache.prefix.keys[0].shape[2]
                mask = torch.cat((torch.arange(columns)[None, :] < length[:, None], mask), dim=1)
            positions = column_positions(mask) if summaries is not None else None
            bias = torch.zeros(mask.shape, dtype=self.embed.dtype)
            bias = bias.masked_fill_(~mask, float("-inf"))[:, None, None, :]

        def attend(index, query, key, value):  # [rows, heads, 1, head_dim], ...
            slot = cache.layers[index]
            slot.keys[:rows, :, hi : hi + 1] = key
            slot.values[:rows, :, hi : hi + 1] = value
            q = (query * self.scaling).reshape(rows, self.kv_heads, groups, self.head_dim)
            if kernel is not None:
                prefix = None
                if shared:
                    store = cache.prefix
                    prefix = (store.keys[index], store.values[index], entry, length)
                extra = None if summaries is None else summaries.kernel_args(index)
                out = decode_attention(
                    kernel, q, slot.keys, slot.values, start, hi + 1, parts, prefix, extra
                )
            else:
                keys = slot.keys[:rows, :, lo : hi + 1]  # [rows, kv_heads, columns, head_dim]
                values = slot.values[:rows, :, lo : hi + 1]
                if shared:
                    store = cache.prefix
                    keys = torch.cat((store.keys[index][entry], keys), dim=2)
                    values = torch.cat((store.values[index][entry], values), dim=2)
                scores = torch.matmul(q, keys.transpose(-1, -2)).add_(bias)
                weights = torch.softmax(scores, dim=-1)
                if summaries is not None:
                    summaries.from_weights(index, weights.reshape(rows, self.heads, -1), positions)
                out = torch.matmul(weights, values)
            return out.reshape(rows, 1, self.heads * self.head_dim)

        return attend

    def _prefill_attention(self, mask: torch.Tensor, kv: list, summaries=None):
        """Causal attention of left-padded prompts over their own keys and values (appended to
        ``kv`` per layer, ``[prompts, kv_heads, width, head_dim]``); the last query's
        summaries to ``summaries`` when given."""
        prompts, width = mask.shape
        real = mask.bool()
        causal = torch.ones((width, width), dtype=torch.bool).tril_()
        allowed = causal & real[:, None, :]  # a query sees the real keys up to itself ...
        allowed |= torch.eye(width, dtype=torch.bool)  # ... and padding queries only themselves
        allowed = allowed[:, None]  # [prompts, 1, width, width]

        def by_prompt(t):  # [prompts * width, heads, 1, head_dim] -> [prompts, heads, width, dim]
            return t.reshape(prompts, width, t.shape[1], self.head_dim).transpose(1, 2)

        def attend(index, query, key, value):
            query, key, value = by_prompt(query), by_prompt(key), by_prompt(value)
            kv.append((key, value))
            if summaries is not None:
                prefill_row(summaries, index, query[:, :, -1], key, real, self.scaling)
            out = F.scaled_dot_product_attention(
                query,
                key,
                value,
                attn_mask=allowed,
                scale=self.scaling,
                enable_gqa=self.heads != self.kv_heads,
            )
            return out.transpose(1, 2).reshape(prompts * width, 1, self.heads * self.head_dim)

        return attend

    # ---- the layers -------------------------------------------------------------------------

    def _forward(self, input_ids, positions, attend, capture: bool, last=None):
        """The layers over ``input_ids`` ``[rows, tokens]``; logits of the rows ``last`` (all
        rows by default) at their last token, and the captured states."""
        rows, tokens = input_ids.shape
        h = F.embedding(input_ids, self.embed)  # [rows, tokens, hidden]
        states = None
        if capture and self.capture_layer_ids:
            states = torch.empty(
                (rows, tokens, len(self.capture_layer_ids), h.shape[-1]), dtype=h.dtype
            )
            if 0 in self._slot:
                states[:, :, self._slot[0]] = h
        cos, sin = self.rotary(h, positions)  # [rows, tokens, head_dim]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # broadcast over heads
        half = self.head_dim // 2
        q_width = self.heads * self.head_dim
        kv_width = self.kv_heads * self.head_dim
        for index, layer in enumerate(self.layers):
            x = _rms_norm(h, layer.ln1, layer.eps1)
            qkv = layer.qkv(x)  # [rows, tokens, q + 2 kv]
            qk = (
                qkv[..., : q_width + kv_width]
                .view(rows, tokens, self.heads + self.kv_heads, self.head_dim)
                .transpose(1, 2)
            )
            rotated = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
            qk = qk * cos + rotated * sin  # [rows, heads + kv_heads, tokens, head_dim]
            value = (
                qkv[..., q_width + kv_width :]
                .view(rows, tokens, self.kv_heads, self.head_dim)
                .transpose(1, 2)
            )
            out = attend(index, qk[:, : self.heads], qk[:, self.heads :], value)
            h = h + layer.o(out)
            x = _rms_norm(h, layer.ln2, layer.eps2)
            gate_up = layer.gate_up(x)
            gate, up = gate_up[..., : self.intermediate], gate_up[..., self.intermediate :]
            mlp = layer.down(F.silu(gate) * up)
            slot = self._slot.get(index + 1) if states is not None else None
            if slot is None:
                h = h + mlp
            else:  # the residual stream is written where the capture reads it
                h = torch.add(h, mlp, out=states[:, :, slot])
        h = h[:, -1] if last is None else h[last, -1]
        logits = self.lm_head(_rms_norm(h, self.norm, self.norm_eps))
        return logits.float(), states

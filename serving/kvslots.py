"""A preallocated KV cache with one row per running sequence (continuous batching without rebuilds).

Every layer owns two buffers ``[row_capacity, kv_heads, capacity, head_dim]``. The running batch is
rows ``0..rows-1`` and columns ``lo..hi-1``; a decode step writes column ``hi`` of every row in
place (no ``torch.cat``) and attention reads the view ``[:rows, :, lo:hi+1]``. Rows are
left-padded: a row's tokens end at column ``hi - 1``; ``mask`` marks each row's real columns and
position ids are explicit per row, so rows of different lengths share the columns.

- A sequence joins by writing its prompt's KV (prefilled on its own) into the next free row at
  columns ``hi - width .. hi - 1`` — the other rows are not touched (``admit``).
- A finished row is replaced by the last row (one row copied, ``remove``); columns that are
  padding in every remaining row are dropped by moving ``lo`` (no copy).
- When the columns run out, the live ones move back to the start of the buffers (in place);
  only when the rows run out are new buffers allocated (rows growing by a quarter, at least 8,
  up to the batch limit), uninitialised, so the copy is amortised over many steps and memory is
  touched only where rows are used. Every layer's keys and values are views of one allocation,
  so a cache given up returns its memory to the system at once. Columns a row can see but never
  wrote (left of its prompt) are zeroed when it joins: attention reads them masked, so they must
  be finite.
- With ``shared_prompts`` (the fused decoder's cache) the prompts' keys and values go to a
  ``hallulog.serving.kvprefix.PrefixStore``, once per distinct prompt of an admission
  (``admit_shared``), and a row holds only the columns its sequence generates; ``entry[r]`` is
  its prompt's entry. Rows then start empty at ``hi`` and no columns are kept free on the left.
- ``kv_bytes``: what the buffers take for a set of sequences at their longest (the engine admits
  a sequence only when that fits its budget, ``hallulog.serving.memory.KVBudget``).

Only for models whose every cache layer is a plain full-attention ``DynamicLayer``
(``hallulog.serving.running_batch.supports_joining``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from hallulog.serving.kvprefix import PrefixStore
from transformers.cache_utils import Cache, DynamicLayer

HEADROOM = 16  # free columns left of ``lo`` after making room, for prompts longer than the batch
GROWTH = 32  # free columns right of ``hi`` after making room (decode steps before the next time)
ROW_STEP = 8  # rows are allocated in multiples of this


def kv_bytes(
    cell: int, rows: int, generated: int, longest: int, prompts: int, prompt: int, shared: bool
) -> int:
    """Bytes of the cache of ``rows`` sequences at their longest (``generated`` tokens at most
    each, ``longest`` positions at most in all), ``prompts`` distinct prompts of up to ``prompt``
    tokens, with the free columns kept; ``cell``: bytes of one column of one row (every layer's
    key and value)."""
    if not rows:
        return 0
    if shared:
        return cell * (rows * (generated + GROWTH) + prompts * prompt)
    return cell * rows * (longest + HEADROOM + GROWTH)


def kv_cell(config, dtype: torch.dtype) -> int:
    """Bytes of one column of one cache row of a model of ``config``: every layer's key and
    value."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * dtype.itemsize


def _uninitialised(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    """A new buffer whose contents are garbage (its pages are touched only where written)."""
    return torch.empty(shape, dtype=like.dtype, device=like.device)


class _SlotLayer(DynamicLayer):
    def __init__(self, owner: SlotKVCache):
        super().__init__()
        self.owner = owner
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:  # buffers come from admit()
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        o = self.owner
        q = key_states.shape[-2]
        self.keys[: o.rows, :, o.hi : o.hi + q] = key_states
        self.values[: o.rows, :, o.hi : o.hi + q] = value_states
        return self.keys[: o.rows, :, o.lo : o.hi + q], self.values[: o.rows, :, o.lo : o.hi + q]

    def get_seq_length(self) -> int:
        return self.owner.hi - self.owner.lo

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0


class SlotKVCache(Cache):
    """The running batch's KV cache; see the module docstring."""

    def __init__(self, num_layers: int, max_rows: int, shared_prompts: bool = False):
        super().__init__(layers=[_SlotLayer(self) for _ in range(num_layers)])
        self.prefix = PrefixStore(num_layers) if shared_prompts else None
        self.entry = torch.zeros(0, dtype=torch.int64)  # [row_capacity] prefix entry of each row
        self.num_layers = num_layers
        self.max_rows = max_rows
        self.rows = 0
        self.lo = self.hi = 0
        self.capacity = 0
        self.row_capacity = 0
        self.mask: torch.Tensor | None = None  # [row_capacity, capacity], 1 = a real token

    # ---- buffers --------------------------------------------------------------------------
    def _make_room(self, rows: int, left: int, right: int, like: torch.Tensor) -> None:
        """Room for ``rows`` rows, ``left`` free columns before the live ones and ``right`` after.

        When the buffers hold that many rows and columns, the live columns move within them (no
        allocation); otherwise new buffers are allocated uninitialised (pages are touched only
        where written) and the live columns copied. Columns outside ``lo..hi-1`` hold garbage:
        ``admit`` zeroes every column a row can see before its own tokens."""
        width = self.hi - self.lo
        cap = left + width + right
        if rows <= self.row_capacity and cap <= self.capacity:
            if self.lo != left and self.rows and width:
                dst, src = slice(left, left + width), slice(self.lo, self.hi)
                overlap = abs(left - self.lo) < width
                for layer in self.layers:
                    for buf in (layer.keys, layer.values):
                        live = buf[: self.rows, :, src]
                        buf[: self.rows, :, dst] = live.clone() if overlap else live
                self.mask[: self.rows, dst] = self.mask[: self.rows, src].clone()
        else:
            row_cap = self.row_capacity
            if rows > row_cap:  # grow by a quarter (whole steps of rows), up to the batch limit
                grown = max(rows, row_cap + max(ROW_STEP, row_cap // 4))
                row_cap = max(rows, min(self.max_rows, -(-grown // ROW_STEP) * ROW_STEP))
            _, heads, _, dim = like.shape
            # one allocation for every layer: given back to the system as a whole when freed
            block = _uninitialised((self.num_layers, 2, row_cap, heads, cap, dim), like)
            for index, layer in enumerate(self.layers):
                keys, values = block[index, 0], block[index, 1]
                if self.rows and width:
                    keys[: self.rows, :, left : left + width] = layer.keys[
                        : self.rows, :, self.lo : self.hi
                    ]
                    values[: self.rows, :, left : left + width] = layer.values[
                        : self.rows, :, self.lo : self.hi
                    ]
                layer.keys, layer.values = keys, values
            mask = torch.zeros((row_cap, cap), dtype=torch.bool, device=like.device)
            if self.rows and width:
                mask[: self.rows, left : left + width] = self.mask[: self.rows, self.lo : self.hi]
            self.mask = mask
            entry = torch.zeros(row_cap, dtype=torch.int64)
            entry[: self.rows] = self.entry[: self.rows]
            self.entry = entry
            self.capacity, self.row_capacity = cap, row_cap
        self.lo, self.hi = left, left + width

    def admit_shared(
        self,
        prefill: Sequence[tuple[torch.Tensor, torch.Tensor]],
        lengths: Sequence[int],
        source: Sequence[int],
    ) -> None:
        """Append one row per item of ``source`` (the prompt of each, an index into ``prefill``:
        each layer's keys and values ``[prompts, kv_heads, width, head_dim]``, left-padded, the
        prompts ``lengths`` long). Each prompt goes to the prefix store once; the rows start
        with no column of their own."""
        n = len(source)
        ids = self.prefix.add(prefill, lengths, [source.count(i) for i in range(len(lengths))])
        if self.rows == 0:
            self.lo = self.hi = 0
        if self.rows + n > self.row_capacity or self.hi + 1 > self.capacity:
            self._make_room(self.rows + n, 0, GROWTH, prefill[0][0])
        start, end = self.rows, self.rows + n
        self.entry[start:end] = torch.tensor([ids[i] for i in source], dtype=torch.int64)
        if self.hi > self.lo:  # seen (masked) by matmul attention: finite
            for layer in self.layers:
                layer.keys[start:end, :, self.lo : self.hi] = 0
                layer.values[start:end, :, self.lo : self.hi] = 0
        self.mask[start:end] = False
        self.rows = end

    def prefix_of_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each running row's prefix entry and its length."""
        entry = self.entry[: self.rows]
        return entry, self.prefix.length[entry]

    def admit(
        self, prefill: Sequence[tuple[torch.Tensor, torch.Tensor]], prefill_mask: torch.Tensor
    ) -> None:
        """Append prefilled (left-padded) rows to the running batch: ``prefill`` holds each
        layer's keys and values ``[n, kv_heads, width, head_dim]``."""
        n, width = prefill_mask.shape
        like = prefill[0][0]
        if self.rows == 0:  # an empty batch: restart the columns where the buffer has room
            self.lo = self.hi = min(max(width, HEADROOM), self.capacity)
        if self.rows + n > self.row_capacity or self.hi < width or self.hi + 1 > self.capacity:
            left = max(width - (self.hi - self.lo), 0) + HEADROOM
            self._make_room(self.rows + n, left, GROWTH, like)
        new_lo = min(self.lo, self.hi - width)
        start, end = self.rows, self.rows + n
        first = self.hi - width
        for mine, (keys, values) in zip(self.layers, prefill):
            for buf, new in ((mine.keys, keys), (mine.values, values)):
                buf[start:end, :, first : self.hi] = new
                buf[start:end, :, new_lo:first] = 0  # seen (masked) by attention: finite
                if new_lo < self.lo:
                    buf[:start, :, new_lo : self.lo] = 0
        self.mask[start:end] = False
        self.mask[start:end, first : self.hi] = prefill_mask
        if new_lo < self.lo:
            self.mask[:start, new_lo : self.lo] = False
            self.lo = new_lo
        self.rows = end

    def step_mask(self, q: int = 1) -> torch.Tensor:
        """Before a decode forward of ``q`` tokens per row: the attention mask ``[rows, width + q]``."""
        if self.hi + q > self.capacity:
            left = 0 if self.prefix is not None else HEADROOM
            self._make_room(self.rows, left, max(GROWTH, q), self.layers[0].keys)
        self.mask[: self.rows, self.hi : self.hi + q] = True
        return self.mask[: self.rows, self.lo : self.hi + q]

    def advance(self, q: int = 1) -> None:
        """After the forward: the ``q`` columns written are part of the cache."""
        self.hi += q

    def remove(self, row: int) -> None:
        """Drop ``row``: the last row moves into its place (the caller mirrors that order)."""
        last = self.rows - 1
        if self.prefix is not None:
            self.prefix.release(int(self.entry[row]))
            self.entry[row] = self.entry[last]
        if row != last:
            for layer in self.layers:
                layer.keys[row, :, self.lo : self.hi] = layer.keys[last, :, self.lo : self.hi]
                layer.values[row, :, self.lo : self.hi] = layer.values[last, :, self.lo : self.hi]
            self.mask[row, self.lo : self.hi] = self.mask[last, self.lo : self.hi]
        self.rows = last

    def trim(self) -> None:
        """Move ``lo`` past the columns that are padding in every row (no copy)."""
        if self.rows == 0:
            self.lo = self.hi
            return
        used = self.mask[: self.rows, self.lo : self.hi].any(dim=0)
        if used.numel():
            self.lo += int(used.int().argmax())  # all-False cannot happen: every row has a token


class Footprint:
    """What the key/value cache of a set of sequences depends on (``kv_bytes``): rows, the most
    tokens one generates, the most positions one reaches, the distinct prompts and the longest."""

    __slots__ = ("rows", "generated", "longest", "prompts", "prompt")

    def __init__(self, seqs: Sequence = ()):
        self.rows = len(seqs)
        self.generated = max((seq.params.max_tokens for seq in seqs), default=0)
        self.longest = max((seq.longest for seq in seqs), default=0)
        self.prompts = {tuple(seq.prompt_ids) for seq in seqs}
        self.prompt = max((len(seq.prompt_ids) for seq in seqs), default=0)

    def plus(self, seq) -> Footprint:
        more = Footprint()
        more.rows = self.rows + 1
        more.generated = max(self.generated, seq.params.max_tokens)
        more.longest = max(self.longest, seq.longest)
        more.prompts = self.prompts | {tuple(seq.prompt_ids)}
        more.prompt = max(self.prompt, len(seq.prompt_ids))
        return more

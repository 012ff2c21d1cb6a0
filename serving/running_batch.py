"""The rows the engine is decoding: their cache (slots, or a DynamicCache for models whose cache
layers cannot take joining rows), positions and next logits, kept in cache row order; and the
prefill inputs of sequences joining them (``Prompts``)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
from hallulog.serving.kvslots import SlotKVCache

if TYPE_CHECKING:
    from hallulog.serving.sequences import SequenceState

__all__ = ["Prompts", "RunningBatch", "supports_joining"]


@dataclasses.dataclass
class Prompts:
    """Sequences to admit and their prefill: the distinct prompts, left-padded, ``source[i]`` the
    prompt row of ``batch[i]``; ``outputs`` (logits, keys/values, states) once computed."""

    batch: list[SequenceState]
    source: list[int]
    unique: int
    lengths: list[int]
    input_ids: torch.Tensor
    mask: torch.Tensor
    positions: torch.Tensor
    outputs: tuple | None = None
    summaries: object = None  # the prefill's attention summaries (``StepSummaries``), if wanted

    @classmethod
    def of(cls, batch: list[SequenceState], pad_id: int, share: bool = True) -> Prompts:
        """``share``: the sequences of one prompt share its row (one prefill per prompt)."""
        rows_of: dict[tuple[int, ...], int] = {}
        source = [
            rows_of.setdefault(tuple(seq.prompt_ids), len(rows_of)) if share else i
            for i, seq in enumerate(batch)
        ]
        unique = [batch[source.index(row)] for row in range(len(rows_of))] or batch
        lengths = [len(seq.prompt_ids) for seq in unique]
        width = max(lengths)
        input_ids = torch.full((len(unique), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(unique), width), dtype=torch.long)
        for row, seq in enumerate(unique):
            input_ids[row, width - lengths[row] :] = torch.tensor(seq.prompt_ids)
            mask[row, width - lengths[row] :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        return cls(batch, source, len(unique), lengths, input_ids, mask, positions)


class RunningBatch:
    """The rows being decoded (in cache row order), their cache, positions and next logits."""

    def __init__(self, cache):
        self.cache = cache  # SlotKVCache, or a DynamicCache (batch-at-a-time models)
        self.active: list[SequenceState] = []
        self.positions: torch.Tensor | None = None  # [rows, 1] position id of each row's last token
        self.logits: torch.Tensor | None = None  # [rows, vocab]
        self.mask: torch.Tensor | None = None  # DynamicCache only: [rows, columns], 0 = padding

    @property
    def slots(self) -> bool:
        return isinstance(self.cache, SlotKVCache)

    def add(self, seqs, prefill, mask, positions, logits) -> None:
        """Append rows: ``prefill`` is their own cache (a ``DynamicCache``), or each layer's
        ``(keys, values)`` for the slot cache."""
        if self.slots:
            if not isinstance(prefill, list):
                prefill = [(layer.keys, layer.values) for layer in prefill.layers]
            self.cache.admit(prefill, mask)
        else:  # batch-at-a-time: the prefill's cache is the run's cache
            self.mask = mask
        if self.active:
            self.positions = torch.cat([self.positions, positions])
            self.logits = torch.cat([self.logits, logits])
        else:
            self.positions, self.logits = positions, logits
        self.active = self.active + list(seqs)

    @property
    def shared_prompts(self) -> bool:
        """Rows of one prompt share its keys/values (``SlotKVCache`` with a prefix store)."""
        return self.slots and self.cache.prefix is not None

    def add_shared(self, seqs, prefill, lengths, source, positions, logits) -> None:
        """Append rows whose prompts' keys/values go to the prefix store once: ``prefill``
        holds each layer's ``(keys, values)`` of the distinct prompts (``lengths`` long),
        ``source[i]`` the prompt of ``seqs[i]``; ``positions``/``logits`` are per row."""
        self.cache.admit_shared(prefill, lengths, source)
        if self.active:
            self.positions = torch.cat([self.positions, positions])
            self.logits = torch.cat([self.logits, logits])
        else:
            self.positions, self.logits = positions, logits
        self.active = self.active + list(seqs)

    def step_mask(self) -> torch.Tensor:
        if self.slots:
            return self.cache.step_mask(1)
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(self.active), 1))], dim=1)
        return self.mask

    def advance(self) -> None:
        if self.slots:
            self.cache.advance(1)

    def drop_finished(self) -> None:
        """Remove the rows whose sequence finished."""
        done = [i for i, seq in enumerate(self.active) if seq.finish_reason is not None]
        if not done:
            return
        if not self.slots:
            self._select([i for i, seq in enumerate(self.active) if seq.finish_reason is None])
            return
        order = list(range(len(self.active)))
        for row in reversed(done):  # highest first: the row moved in is never a finished one
            self.cache.remove(row)
            order[row] = order[-1]
            order.pop()
        self.active = [self.active[i] for i in order]
        if order:
            index = torch.tensor(order, device=self.logits.device)
            self.positions, self.logits = self.positions[index], self.logits[index]
        self.cache.trim()

    def _select(self, keep: list[int]) -> None:
        """DynamicCache: keep rows ``keep``, then drop the columns that are padding in every row."""
        self.active = [self.active[i] for i in keep]
        if not keep:
            return
        index = torch.tensor(keep, device=self.mask.device)
        self.cache.batch_select_indices(index)
        self.mask, self.positions, self.logits = (
            self.mask[index],
            self.positions[index],
            self.logits[index],
        )
        first = int(self.mask.any(dim=0).int().argmax())
        if first > 0:
            self.mask = self.mask[:, first:]
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[..., first:, :], layer.values[..., first:, :]


def supports_joining(model: torch.nn.Module) -> bool:
    """Rows can join a running batch only when every cache layer is a plain growing KV cache."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    try:
        cache = DynamicCache(config=model.config)
    except Exception:  # noqa: BLE001 - unknown config: stay with batch-at-a-time
        return False
    return all(type(layer) is DynamicLayer for layer in cache.layers)

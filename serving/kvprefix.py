"""The prompts' keys and values, held once for every running sequence of the same prompt.

A run sends each question's greedy answer and its k samples together; they share one prefill
(``hallulog.serving.running_batch.Prompts``), and with a ``PrefixStore`` they share its keys and
values too: the prompt's columns are stored once, in an entry, and each of the sequences' rows of
the slot cache (``hallulog.serving.kvslots.SlotKVCache``) holds only what it generates. Attention
reads a row's entry first, then its own columns (``hallulog.serving.attention_kernel``: the same
columns in the same order as when the prompt was copied into every row, so the same results to
the bit). For the default job's traffic (prompts of ~55 tokens, answers of up to 64, six answers
a prompt) that is ~40 % of the cache.

Every layer's entries are ``[entries, kv_heads, columns, head_dim]``, views of one allocation
(grown by a quarter, at least 8 entries, and to the longest prompt; the entries are copied). An
entry is counted by the rows that use it and freed with the last one; a freed entry is reused.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["PrefixStore"]

ENTRY_STEP = 8


class PrefixStore:
    """Entries of prompt keys/values; see the module docstring."""

    def __init__(self, num_layers: int):
        self.num_layers = num_layers
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.length = torch.zeros(0, dtype=torch.int64)  # [entries] columns of each entry
        self.refs: list[int] = []
        self.free: list[int] = []

    @property
    def capacity(self) -> tuple[int, int]:
        """``(entries, columns)`` the buffers hold."""
        return (self.keys[0].shape[0], self.keys[0].shape[2]) if self.keys else (0, 0)

    def add(
        self,
        kv: Sequence[tuple[torch.Tensor, torch.Tensor]],
        lengths: Sequence[int],
        uses: Sequence[int],
    ) -> list[int]:
        """Store prompt ``i`` (its last ``lengths[i]`` columns of every layer's ``kv[l]``,
        ``[prompts, kv_heads, width, head_dim]``, left-padded) for ``uses[i]`` rows; returns the
        entries."""
        ids = [self.free.pop() if self.free else None for _ in lengths]
        fresh = sum(entry is None for entry in ids)
        entries, columns = self.capacity
        used = len(self.refs)
        if used + fresh > entries or max(lengths) > columns:
            self._grow(used + fresh, max(lengths), kv[0][0])
        for index, entry in enumerate(ids):
            if entry is None:
                ids[index] = used
                self.refs.append(0)
                used += 1
        for (keys, values), mine_k, mine_v in zip(kv, self.keys, self.values):
            width = keys.shape[2]
            for entry, n, source in zip(ids, lengths, range(len(ids))):
                mine_k[entry, :, :n] = keys[source, :, width - n :]
                mine_v[entry, :, :n] = values[source, :, width - n :]
                mine_k[entry, :, n:] = 0  # a reused entry's past (see _grow)
                mine_v[entry, :, n:] = 0
        for entry, n, count in zip(ids, lengths, uses):
            self.length[entry] = n
            self.refs[entry] += count
        return ids

    def release(self, entry: int) -> None:
        """One row less uses ``entry``; the last one frees it."""
        self.refs[entry] -= 1
        if self.refs[entry] == 0:
            self.length[entry] = 0
            self.free.append(entry)

    def _grow(self, entries: int, columns: int, like: torch.Tensor) -> None:
        old_entries, old_columns = self.capacity
        if entries > old_entries:
            grown = max(entries, old_entries + max(ENTRY_STEP, old_entries // 4))
            entries = -(-grown // ENTRY_STEP) * ENTRY_STEP
        entries, columns = max(entries, old_entries), max(columns, old_columns)
        _, heads, _, dim = like.shape
        # zeroed: attention through matmul reads an entry's columns past its length, masked
        block = torch.zeros(
            (self.num_layers, 2, entries, heads, columns, dim), dtype=like.dtype, device=like.device
        )
        for index in range(self.num_layers):
            keys, values = block[index, 0], block[index, 1]
            if old_entries:
                keys[:old_entries, :, :old_columns] = self.keys[index]
                values[:old_entries, :, :old_columns] = self.values[index]
            if index < len(self.keys):
                self.keys[index], self.values[index] = keys, values
            else:
                self.keys.append(keys)
                self.values.append(values)
        length = torch.zeros(entries, dtype=torch.int64)
        length[:old_entries] = self.length[:old_entries]
        self.length = length

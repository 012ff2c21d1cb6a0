"""The PyTorch side: a Dataset for the probe-training read pattern and its collate function."""

from __future__ import annotations

import os

import numpy as np
import torch
from torch.utils.data import Dataset

from .base import ActivationReader
from .registry import open_store

__all__ = ["ActivationPairsDataset", "collate_pairs"]


class ActivationPairsDataset(Dataset):
    """index -> one sample at ``layers_per_sample`` distinct random layers, all tokens.

    The layers come from ``numpy.random.default_rng((seed, epoch, index))``: the same for a given
    (seed, epoch, index) whatever the worker count or start method. ``set_epoch`` changes them.
    The reader opens its files lazily in each DataLoader worker and is dropped from pickles.

    Item: ``acts`` (k, T, H) tensor, ``layers`` (k,) layer ids, ``layer_pos`` (k,) positions,
    ``label``, ``seq_len``, ``prompt_len``, ``response_len``, ``index``.
    """

    def __init__(self, store, layers_per_sample: int = 2, seed: int = 0, layer_positions=None):
        self.store_path = store.path if isinstance(store, ActivationReader) else os.fspath(store)
        self._reader = store if isinstance(store, ActivationReader) else None
        self.layers_per_sample = int(layers_per_sample)
        self.seed = int(seed)
        self.epoch = 0
        r = self.reader
        self.layer_positions = np.arange(r.num_layers) if layer_positions is None else np.asarray(layer_positions)
        if self.layers_per_sample > len(self.layer_positions):
            raise ValueError(f"{self.layers_per_sample} layers per sample but the store has {len(self.layer_positions)}")
        self.layer_ids = np.asarray(r.layer_ids)
        self._len = len(r)

    @property
    def reader(self) -> ActivationReader:
        if self._reader is None:
            self._reader = open_store(self.store_path)
        return self._reader

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self._len

    def layers_for(self, index: int) -> np.ndarray:
        rng = np.random.default_rng((self.seed, self.epoch, int(index)))
        return rng.choice(self.layer_positions, size=self.layers_per_sample, replace=False)

    def __getitem__(self, index: int) -> dict:
        r = self.reader
        pos = self.layers_for(index)
        m = r.meta(index)
        acts = np.empty((len(pos), m["seq_len"], r.hidden_size), r.dtype)
        r.read_pairs_into([index] * len(pos), pos, list(acts))
        return {
            "acts": torch.from_numpy(acts),
            "layers": torch.from_numpy(self.layer_ids[pos].astype(np.int64)),
            "layer_pos": torch.from_numpy(pos.astype(np.int64)),
            "label": torch.tensor(m["label"], dtype=torch.int64),
            "seq_len": torch.tensor(m["seq_len"], dtype=torch.int64),
            "prompt_len": torch.tensor(m["prompt_len"], dtype=torch.int64),
            "response_len": torch.tensor(m["response_len"], dtype=torch.int64),
            "index": torch.tensor(int(index), dtype=torch.int64),
        }


def collate_pairs(batch: list[dict]) -> dict:
    """Pad ``acts`` to the longest sample: ``acts`` (B, k, T_max, H) with zeros past each
    ``seq_len``, ``mask`` (B, T_max) bool (True = real token); scalars stacked to (B,)."""
    t_max = max(int(b["seq_len"]) for b in batch)
    k, _, h = batch[0]["acts"].shape
    # padding in numpy (slice assignment is memcpy);
    # the same in torch CPU half precision is an order of magnitude slower
    acts = np.empty((len(batch), k, t_max, h), dtype=batch[0]["acts"].numpy().dtype)
    mask = np.zeros((len(batch), t_max), dtype=bool)
    for j, b in enumerate(batch):
        t = int(b["seq_len"])
        acts[j, :, :t] = b["acts"].numpy()
        acts[j, :, t:] = 0  # write each byte once: data or padding
        mask[j, :t] = True
    acts, mask = torch.from_numpy(acts), torch.from_numpy(mask)
    out = {"acts": acts, "mask": mask}
    for key in ("layers", "layer_pos"):
        out[key] = torch.stack([b[key] for b in batch])
    for key in ("label", "seq_len", "prompt_len", "response_len", "index"):
        out[key] = torch.stack([b[key] for b in batch])
    return out

"""Reading sft-packed shards: one shard (seed 004 §2.1) or several concatenated (seed 004 §2.2),
and the collate function that pads a batch."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np
from hallulog.exports.sft_packed.layout import ARRAYS, FORMAT, MANIFEST, MANIFEST_FIELDS, array_file
from hallulog.storage.errors import ManifestError, StorageError

__all__ = [
    "PackedSftDataset",
    "PackedSftMultiShardDataset",
    "open_packed_sft",
    "collate_packed_sft",
]


class PackedSftDataset:
    """Seed 004 §2.1 without the tokenizer: one shard, memmaps opened lazily per process.

    Item: ``{"input_ids": int32 (packed_len,), "loss_mask": uint8 (packed_len,),
    "seq_boundaries": [starts..., packed_len]}``. ``samples_mapping`` optionally remaps indices.
    """

    _MAPS = tuple(ARRAYS)

    def __init__(self, shard_dir, samples_mapping=None):
        self.shard_dir = os.fspath(shard_dir)
        mpath = os.path.join(self.shard_dir, MANIFEST)
        try:
            with open(mpath) as f:
                self.manifest = json.load(f)
        except FileNotFoundError:
            raise ManifestError("no manifest: shard not finalized", mpath) from None
        except ValueError as e:
            raise ManifestError(f"unparsable manifest ({e})", mpath) from None
        missing = [k for k in MANIFEST_FIELDS if k not in self.manifest]
        if missing or self.manifest["format"] != FORMAT:
            raise ManifestError(f"not a {FORMAT} manifest (lacks {missing})", mpath)
        self._num_bins = int(self.manifest["num_bins"])
        self._pack_size = int(self.manifest["pack_size"])
        self.samples_mapping = samples_mapping
        self._loaded = False

    def _ensure_memmaps_open(self) -> None:
        if self._loaded:
            return
        want = {
            "input_ids": ((self._num_bins, self._pack_size), self.manifest["dtype"]),
            "loss_mask": ((self._num_bins, self._pack_size), self.manifest["loss_mask_dtype"]),
            "packed_len": ((self._num_bins,), self.manifest["index_dtype"]),
            "seq_offsets": ((self._num_bins + 1,), self.manifest["index_dtype"]),
            "seq_starts": (None, self.manifest["index_dtype"]),
        }
        for name in self._MAPS:
            p = os.path.join(self.shard_dir, array_file(name))
            try:
                a = np.load(p, mmap_mode="r", allow_pickle=False)
            except FileNotFoundError:
                raise ManifestError("array file is missing", p) from None
            shape, dt = want[name]
            if (shape is not None and a.shape != shape) or np.dtype(dt) != a.dtype:
                raise ManifestError(
                    f"has shape {a.shape} dtype {a.dtype.str}, manifest implies {shape} {dt}", p
                )
            setattr(self, name, a)
        self._loaded = True

    def __len__(self) -> int:
        return self._num_bins if self.samples_mapping is None else len(self.samples_mapping)

    def __getitem__(self, idx: int) -> dict:
        self._ensure_memmaps_open()
        if self.samples_mapping is not None:
            idx = int(self.samples_mapping[idx])
        if not -self._num_bins <= idx < self._num_bins:
            raise IndexError(f"bin {idx} out of range for {self._num_bins} in {self.shard_dir}")
        n = int(self.packed_len[idx])
        a, b = int(self.seq_offsets[idx]), int(self.seq_offsets[idx + 1])
        return {
            "input_ids": np.array(self.input_ids[idx, :n]),
            "loss_mask": np.array(self.loss_mask[idx, :n]),
            "seq_boundaries": [int(x) for x in self.seq_starts[a:b]] + [n],
        }

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_loaded"] = False
        for k in self._MAPS:
            state.pop(k, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)


class PackedSftMultiShardDataset:
    """Seed 004 §2.2: shards concatenated; ``shard_offsets`` are cumulative bin counts."""

    def __init__(self, shard_dirs: Sequence):
        self.shards = [PackedSftDataset(d) for d in shard_dirs]
        if not self.shards:
            raise StorageError("no shards given")
        self.shard_offsets = np.cumsum([0] + [len(s) for s in self.shards])

    def __len__(self) -> int:
        return int(self.shard_offsets[-1])

    def __getitem__(self, idx: int) -> dict:
        n = len(self)
        if not -n <= idx < n:
            raise IndexError(f"bin {idx} out of range for {n}")
        idx %= n
        s = int(np.searchsorted(self.shard_offsets[1:], idx, side="right"))
        return self.shards[s][idx - int(self.shard_offsets[s])]


def open_packed_sft(path):
    """A shard directory (has ``manifest.json``) → one shard; an export directory → all its
    ``shard_*`` subdirectories in order."""
    path = os.fspath(path)
    if os.path.exists(os.path.join(path, MANIFEST)):
        return PackedSftDataset(path)
    dirs = sorted(
        os.path.join(path, d)
        for d in os.listdir(path)
        if d.startswith("shard_") and os.path.isdir(os.path.join(path, d))
    )
    if not dirs:
        raise ManifestError("neither a packed SFT shard nor a directory of shard_* shards", path)
    return PackedSftMultiShardDataset(dirs)


def collate_packed_sft(batch: list[dict]) -> dict:
    """Pad to the longest bin: ``input_ids`` (B, T) int64, ``loss_mask`` (B, T) uint8,
    ``attention_mask`` (B, T) bool; ``seq_boundaries`` stays a list of lists."""
    import torch

    t = max(len(b["input_ids"]) for b in batch)
    ids = np.zeros((len(batch), t), np.int64)
    mask = np.zeros((len(batch), t), np.uint8)
    att = np.zeros((len(batch), t), bool)
    for j, b in enumerate(batch):
        n = len(b["input_ids"])
        ids[j, :n], mask[j, :n], att[j, :n] = b["input_ids"], b["loss_mask"], True
    return {
        "input_ids": torch.from_numpy(ids),
        "loss_mask": torch.from_numpy(mask),
        "attention_mask": torch.from_numpy(att),
        "seq_boundaries": [b["seq_boundaries"] for b in batch],
    }

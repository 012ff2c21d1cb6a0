"""``sft-packed``: seed 004's memmap padded fixed-shape + CSR packed SFT format.

Normative description: docs/formats/sft-packed.md. One shard directory::

    input_ids.npy  int32[num_bins, pack_size]   loss_mask.npy  uint8[num_bins, pack_size]
    packed_len.npy uint32[num_bins]             seq_offsets.npy uint32[num_bins + 1] (CSR)
    seq_starts.npy uint32[total_seq_starts]     manifest.json

``export_sft`` builds it from ``consolidated/`` generations (first-fit-decreasing packing,
loss on response tokens, the mask rolled by one as seed 004 §1.2); ``MemmapShardWriter``
pre-allocates ``.npy.tmp`` memmaps and renames them at ``finalize``; ``PackedSftDataset`` opens
memmaps lazily per DataLoader worker and drops them when pickled; ``PackedSftMultiShardDataset``
concatenates shards by cumulative offsets. ``convert_legacy_to_memmap`` reads a legacy
pickle-of-dicts ``.npy`` — it unpickles, so it only ever reads a file the user names.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Callable, Sequence

import numpy as np

from ._io import atomic_write_json, fsync_dir
from .errors import ManifestError, StorageError

log = logging.getLogger(__name__)

__all__ = [
    "MemmapShardWriter", "materialize_bin_arrays", "first_fit_decreasing", "export_sft",
    "PackedSftDataset", "PackedSftMultiShardDataset", "open_packed_sft", "collate_packed_sft",
    "convert_legacy_to_memmap", "FORMAT",
]

FORMAT = "memmap_padded_v1"
VERSION = "1.0"
#: array files: name -> dtype (docs/formats/sft-packed.md, table "arrays")
ARRAYS = {
    "input_ids": "<i4",
    "loss_mask": "|u1",
    "packed_len": "<u4",
    "seq_offsets": "<u4",
    "seq_starts": "<u4",
}
#: manifest.json keys (table "manifest.json"), seed 004 §1.1
MANIFEST_FIELDS = ("version", "format", "num_bins", "pack_size", "dtype", "loss_mask_dtype", "index_dtype",
                   "bins_written")
#: export.json keys written next to the shards by export_sft (table "export.json")
EXPORT_FIELDS = ("format", "source", "select", "pack_size", "num_sequences", "num_truncated", "num_bins",
                 "shards", "loss_mask_roll")
#: sequences.jsonl keys (table "sequences.jsonl")
SEQUENCE_FIELDS = ("shard", "bin", "start", "length", "prompt_id", "sample_id", "truncated")


def shard_dir_name(k: int) -> str:
    return f"shard_{k:06d}"


class MemmapShardWriter:
    """Seed 004 §1.1: pre-allocated ``open_memmap`` arrays, bins written one at a time.

    Peak memory is O(pack_size) (the caller's scratch buffers); files are ``<name>.npy.tmp``
    until ``finalize`` flushes, renames them and writes ``manifest.json`` (via ``.tmp``).
    """

    def __init__(self, output_dir, num_bins: int, pack_size: int, total_seq_starts: int, dtype=np.int32):
        self.output_dir = os.fspath(output_dir)
        self.num_bins, self.pack_size = int(num_bins), int(pack_size)
        self.dtype = np.dtype(dtype)
        self.total_seq_starts = int(total_seq_starts)
        os.makedirs(self.output_dir, exist_ok=True)
        mp = os.path.join(self.output_dir, "manifest.json")
        if os.path.exists(mp):
            os.unlink(mp)  # rewriting a shard: the old manifest would describe new bytes

        def mm(name, dt, shape):
            return np.lib.format.open_memmap(self._tmp(name), mode="w+", dtype=dt, shape=shape)

        self.input_ids = mm("input_ids", self.dtype, (self.num_bins, self.pack_size))
        self.loss_mask = mm("loss_mask", np.uint8, (self.num_bins, self.pack_size))
        self.packed_len = mm("packed_len", np.uint32, (self.num_bins,))
        self.seq_offsets = mm("seq_offsets", np.uint32, (self.num_bins + 1,))
        self.seq_starts = mm("seq_starts", np.uint32, (self.total_seq_starts,))
        self._seq_write_pos = 0
        self.seq_offsets[0] = 0
        self._bins_written = 0

    def _tmp(self, name: str) -> str:
        return os.path.join(self.output_dir, f"{name}.npy.tmp")

    def write_bin(self, bin_id: int, input_ids: np.ndarray, loss_mask: np.ndarray, seq_start_id: np.ndarray) -> None:
        n = len(input_ids)
        if n > self.pack_size or len(loss_mask) != n:
            raise StorageError(f"bin {bin_id}: {n} tokens, {len(loss_mask)} mask entries, pack_size {self.pack_size}",
                               self.output_dir)
        if bin_id != self._bins_written:
            raise StorageError(f"bins must be written in order: got {bin_id}, expected {self._bins_written}",
                               self.output_dir)
        self.input_ids[bin_id, :n] = input_ids
        self.loss_mask[bin_id, :n] = loss_mask
        self.packed_len[bin_id] = n
        s = len(seq_start_id)
        if self._seq_write_pos + s > self.total_seq_starts:
            raise StorageError(f"more than total_seq_starts={self.total_seq_starts} sequence starts", self.output_dir)
        self.seq_starts[self._seq_write_pos:self._seq_write_pos + s] = seq_start_id
        self._seq_write_pos += s
        self.seq_offsets[bin_id + 1] = self._seq_write_pos
        self._bins_written += 1

    def finalize(self) -> dict[str, Any]:
        if self._bins_written != self.num_bins or self._seq_write_pos != self.total_seq_starts:
            raise StorageError(f"{self._bins_written}/{self.num_bins} bins and {self._seq_write_pos}/"
                               f"{self.total_seq_starts} sequence starts written; not finalizing", self.output_dir)
        for name in ARRAYS:
            getattr(self, name).flush()
            delattr(self, name)
        for name in ARRAYS:
            with open(self._tmp(name), "rb+") as f:
                os.fsync(f.fileno())
            os.replace(self._tmp(name), os.path.join(self.output_dir, f"{name}.npy"))
        fsync_dir(self.output_dir)
        manifest = {
            "version": VERSION, "format": FORMAT, "num_bins": self.num_bins, "pack_size": self.pack_size,
            "dtype": self.dtype.str, "loss_mask_dtype": "<u1", "index_dtype": "<u4",
            "bins_written": self._bins_written,
        }
        atomic_write_json(os.path.join(self.output_dir, "manifest.json"), manifest)
        return manifest


def materialize_bin_arrays(read_sequence: Callable[[int], tuple[np.ndarray, np.ndarray]], seq_indices: Sequence[int],
                           pack_size: int, scratch_input_ids: np.ndarray, scratch_loss_mask: np.ndarray
                           ) -> tuple[int, np.ndarray]:
    """Seed 004 §1.2: concatenate a bin's sequences into the scratch buffers (truncating at
    ``pack_size``), then roll the loss mask right by one (position 0 gets 0). Returns
    ``(packed_len, seq_start_id)``; ``seq_start_id[0] == 0``, strictly increasing, ``< packed_len``."""
    scratch_input_ids[:] = 0
    scratch_loss_mask[:] = 0
    pos = 0
    starts = []
    for k in seq_indices:
        ids, mask = read_sequence(int(k))
        n = min(len(ids), pack_size, pack_size - pos)
        if n <= 0:
            break
        starts.append(pos)
        scratch_input_ids[pos:pos + n] = ids[:n]
        scratch_loss_mask[pos:pos + n] = mask[:n]
        pos += n
    if pos > 0:
        scratch_loss_mask[1:pos] = scratch_loss_mask[:pos - 1].copy()
        scratch_loss_mask[0] = 0
    return pos, np.asarray(starts, dtype=np.uint32)


def first_fit_decreasing(lengths: Sequence[int], pack_size: int) -> list[list[int]]:
    """Bins of sequence indices: longest first, each into the first bin it fits (lengths are
    capped at ``pack_size``: a longer sequence gets a bin of its own and is truncated)."""
    lengths = np.minimum(np.asarray(lengths, np.int64), pack_size)
    order = np.argsort(-lengths, kind="stable")
    remaining = np.empty(max(1, len(lengths)), np.int64)
    bins: list[list[int]] = []
    for k in order:
        n = int(lengths[k])
        fits = np.flatnonzero(remaining[:len(bins)] >= n)
        if len(fits):
            b = int(fits[0])
        else:
            b = len(bins)
            bins.append([])
            remaining[b] = pack_size
        bins[b].append(int(k))
        remaining[b] -= n
    return bins


def export_sft(consolidated_dir, out_dir, pack_size: int = 4096, select="correct_primary",
               bins_per_shard: int | None = None) -> dict:
    """Pack the selected generations of ``consolidated_dir`` into ``out_dir/shard_NNNNNN/``.

    Writes ``export.json`` (provenance) and ``sequences.jsonl`` (where each sequence landed)
    next to the shards. Returns the export summary.
    """
    from ._sft_source import ConsolidatedSequences

    src = ConsolidatedSequences(consolidated_dir, select)
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    bins = first_fit_decreasing(src.lengths, pack_size)
    per = bins_per_shard or max(1, len(bins))
    scratch_ids = np.zeros(pack_size, np.int32)
    scratch_mask = np.zeros(pack_size, np.uint8)
    shards = []
    seq_tmp = os.path.join(out_dir, "sequences.jsonl.tmp")
    try:
        with open(seq_tmp, "w", encoding="utf-8") as seqf:
            for k, b0 in enumerate(range(0, len(bins), per)):
                group = bins[b0:b0 + per]
                name = shard_dir_name(k)
                w = MemmapShardWriter(os.path.join(out_dir, name), len(group), pack_size, sum(len(g) for g in group))
                for j, seqs in enumerate(group):
                    n, starts = materialize_bin_arrays(src.read_sequence, seqs, pack_size, scratch_ids, scratch_mask)
                    w.write_bin(j, scratch_ids[:n], scratch_mask[:n], starts)
                    for s, st in zip(seqs, starts):
                        pid, sid = src.ids[s]
                        ln = min(int(src.lengths[s]), pack_size)
                        seqf.write(json.dumps({"shard": name, "bin": j, "start": int(st), "length": ln,
                                               "prompt_id": pid, "sample_id": sid,
                                               "truncated": bool(src.lengths[s] > pack_size)}) + "\n")
                w.finalize()
                shards.append(name)
            seqf.flush()
            os.fsync(seqf.fileno())
    finally:
        src.close()
    os.replace(seq_tmp, os.path.join(out_dir, "sequences.jsonl"))
    summary = {"format": FORMAT, "source": os.path.abspath(os.fspath(consolidated_dir)),
               "select": select if isinstance(select, str) else getattr(select, "__name__", "callable"),
               "pack_size": int(pack_size), "num_sequences": len(src),
               "num_truncated": int((src.lengths > pack_size).sum()), "num_bins": len(bins), "shards": shards,
               "loss_mask_roll": 1}
    atomic_write_json(os.path.join(out_dir, "export.json"), summary)
    log.info("packed %d sequences into %d bins (%d shards) in %s", len(src), len(bins), len(shards), out_dir)
    return summary


class PackedSftDataset:
    """Seed 004 §2.1 without the tokenizer: one shard, memmaps opened lazily per process.

    Item: ``{"input_ids": int32 (packed_len,), "loss_mask": uint8 (packed_len,),
    "seq_boundaries": [starts..., packed_len]}``. ``samples_mapping`` optionally remaps indices.
    """

    _MAPS = tuple(ARRAYS)

    def __init__(self, shard_dir, samples_mapping=None):
        self.shard_dir = os.fspath(shard_dir)
        mpath = os.path.join(self.shard_dir, "manifest.json")
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
        want = {"input_ids": ((self._num_bins, self._pack_size), self.manifest["dtype"]),
                "loss_mask": ((self._num_bins, self._pack_size), self.manifest["loss_mask_dtype"]),
                "packed_len": ((self._num_bins,), self.manifest["index_dtype"]),
                "seq_offsets": ((self._num_bins + 1,), self.manifest["index_dtype"]),
                "seq_starts": (None, self.manifest["index_dtype"])}
        for name in self._MAPS:
            p = os.path.join(self.shard_dir, f"{name}.npy")
            try:
                a = np.load(p, mmap_mode="r", allow_pickle=False)
            except FileNotFoundError:
                raise ManifestError("array file is missing", p) from None
            shape, dt = want[name]
            if (shape is not None and a.shape != shape) or np.dtype(dt) != a.dtype:
                raise ManifestError(f"has shape {a.shape} dtype {a.dtype.str}, manifest implies {shape} {dt}", p)
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
        return {"input_ids": np.array(self.input_ids[idx, :n]), "loss_mask": np.array(self.loss_mask[idx, :n]),
                "seq_boundaries": [int(x) for x in self.seq_starts[a:b]] + [n]}

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
    if os.path.exists(os.path.join(path, "manifest.json")):
        return PackedSftDataset(path)
    dirs = sorted(os.path.join(path, d) for d in os.listdir(path)
                  if d.startswith("shard_") and os.path.isdir(os.path.join(path, d)))
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
    return {"input_ids": torch.from_numpy(ids), "loss_mask": torch.from_numpy(mask),
            "attention_mask": torch.from_numpy(att), "seq_boundaries": [b["seq_boundaries"] for b in batch]}


def convert_legacy_to_memmap(legacy_npy_path, output_dir, pack_size: int | None = None) -> dict[str, Any]:
    """Seed 004 "Conversion Tool": legacy pickle-of-dicts ``.npy`` → one memmap shard.

    TRUSTED INPUT ONLY: the legacy format is a pickle, and loading it runs arbitrary code from
    the file. This function reads exactly the path the caller names and nothing else.
    """
    data = np.load(os.fspath(legacy_npy_path), allow_pickle=True)  # trusted: named by the user
    num_bins = len(data)
    size = max((len(d["input_ids"]) for d in data), default=1) if pack_size is None else int(pack_size)
    total = sum(len(d["seq_start_id"]) for d in data)
    w = MemmapShardWriter(output_dir, num_bins, size, total)
    for i, d in enumerate(data):
        w.write_bin(i, np.asarray(d["input_ids"], np.int32), np.asarray(d["loss_mask"], np.uint8),
                    np.asarray(d["seq_start_id"], np.uint32))
    return w.finalize()

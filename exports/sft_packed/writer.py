"""``MemmapShardWriter``: one shard written bin by bin into pre-allocated memmaps (seed 004 §1.1)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from hallulog.exports.sft_packed.layout import ARRAYS, FORMAT, MANIFEST, VERSION, array_file
from hallulog.storage._io import atomic_write_json, fsync_dir
from hallulog.storage.errors import StorageError

__all__ = ["MemmapShardWriter"]


class MemmapShardWriter:
    """Seed 004 §1.1: pre-allocated ``open_memmap`` arrays, bins written one at a time.

    Peak memory is O(pack_size) (the caller's scratch buffers); files are ``<name>.npy.tmp``
    until ``finalize`` flushes, renames them and writes ``manifest.json`` (via ``.tmp``).
    """

    def __init__(
        self, output_dir, num_bins: int, pack_size: int, total_seq_starts: int, dtype=np.int32
    ):
        self.output_dir = os.fspath(output_dir)
        self.num_bins, self.pack_size = int(num_bins), int(pack_size)
        self.dtype = np.dtype(dtype)
        self.total_seq_starts = int(total_seq_starts)
        os.makedirs(self.output_dir, exist_ok=True)
        mp = os.path.join(self.output_dir, MANIFEST)
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

    def write_bin(
        self, bin_id: int, input_ids: np.ndarray, loss_mask: np.ndarray, seq_start_id: np.ndarray
    ) -> None:
        n = len(input_ids)
        if n > self.pack_size or len(loss_mask) != n:
            raise StorageError(
                f"bin {bin_id}: {n} tokens, {len(loss_mask)} mask entries, pack_size {self.pack_size}",
                self.output_dir,
            )
        if bin_id != self._bins_written:
            raise StorageError(
                f"bins must be written in order: got {bin_id}, expected {self._bins_written}",
                self.output_dir,
            )
        self.input_ids[bin_id, :n] = input_ids
        self.loss_mask[bin_id, :n] = loss_mask
        self.packed_len[bin_id] = n
        s = len(seq_start_id)
        if self._seq_write_pos + s > self.total_seq_starts:
            raise StorageError(
                f"more than total_seq_starts={self.total_seq_starts} sequence starts",
                self.output_dir,
            )
        self.seq_starts[self._seq_write_pos : self._seq_write_pos + s] = seq_start_id
        self._seq_write_pos += s
        self.seq_offsets[bin_id + 1] = self._seq_write_pos
        self._bins_written += 1

    def finalize(self) -> dict[str, Any]:
        if self._bins_written != self.num_bins or self._seq_write_pos != self.total_seq_starts:
            raise StorageError(
                f"{self._bins_written}/{self.num_bins} bins and {self._seq_write_pos}/"
                f"{self.total_seq_starts} sequence starts written; not finalizing",
                self.output_dir,
            )
        for name in ARRAYS:
            getattr(self, name).flush()
            delattr(self, name)
        for name in ARRAYS:
            with open(self._tmp(name), "rb+") as f:
                os.fsync(f.fileno())
            os.replace(self._tmp(name), os.path.join(self.output_dir, array_file(name)))
        fsync_dir(self.output_dir)
        manifest = {
            "version": VERSION,
            "format": FORMAT,
            "num_bins": self.num_bins,
            "pack_size": self.pack_size,
            "dtype": self.dtype.str,
            "loss_mask_dtype": "<u1",
            "index_dtype": "<u4",
            "bins_written": self._bins_written,
        }
        atomic_write_json(os.path.join(self.output_dir, MANIFEST), manifest)
        return manifest

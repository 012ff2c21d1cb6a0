"""Seed 004 "Conversion Tool": a legacy pickle-of-dicts ``.npy`` into one memmap shard."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from hallulog.exports.sft_packed.writer import MemmapShardWriter

__all__ = ["convert_legacy_to_memmap"]


def convert_legacy_to_memmap(
    legacy_npy_path, output_dir, pack_size: int | None = None
) -> dict[str, Any]:
    """Seed 004 "Conversion Tool": legacy pickle-of-dicts ``.npy`` → one memmap shard.

    TRUSTED INPUT ONLY: the legacy format is a pickle, and loading it runs arbitrary code from
    the file. This function reads exactly the path the caller names and nothing else.
    """
    data = np.load(os.fspath(legacy_npy_path), allow_pickle=True)  # trusted: named by the user
    num_bins = len(data)
    size = (
        max((len(d["input_ids"]) for d in data), default=1) if pack_size is None else int(pack_size)
    )
    total = sum(len(d["seq_start_id"]) for d in data)
    w = MemmapShardWriter(output_dir, num_bins, size, total)
    for i, d in enumerate(data):
        w.write_bin(
            i,
            np.asarray(d["input_ids"], np.int32),
            np.asarray(d["loss_mask"], np.uint8),
            np.asarray(d["seq_start_id"], np.uint32),
        )
    return w.finalize()

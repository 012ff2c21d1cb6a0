"""``export_sft``: the selected generations of ``consolidated/`` packed into sft-packed shards."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
from hallulog.exports.sft_packed.layout import EXPORT, FORMAT, SEQUENCES, shard_dir_name
from hallulog.exports.sft_packed.packing import first_fit_decreasing, materialize_bin_arrays
from hallulog.exports.sft_packed.source import ConsolidatedSequences
from hallulog.exports.sft_packed.writer import MemmapShardWriter
from hallulog.storage._io import atomic_write_json

log = logging.getLogger(__name__)

__all__ = ["export_sft"]


def export_sft(
    consolidated_dir,
    out_dir,
    pack_size: int = 4096,
    select="correct_primary",
    bins_per_shard: int | None = None,
) -> dict:
    """Pack the selected generations of ``consolidated_dir`` into ``out_dir/shard_NNNNNN/``.

    Writes ``export.json`` (provenance) and ``sequences.jsonl`` (where each sequence landed)
    next to the shards. Returns the export summary.
    """
    src = ConsolidatedSequences(consolidated_dir, select)
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    bins = first_fit_decreasing(src.lengths, pack_size)
    per = bins_per_shard or max(1, len(bins))
    scratch_ids = np.zeros(pack_size, np.int32)
    scratch_mask = np.zeros(pack_size, np.uint8)
    shards = []
    seq_tmp = os.path.join(out_dir, SEQUENCES + ".tmp")
    try:
        with open(seq_tmp, "w", encoding="utf-8") as seqf:
            for k, b0 in enumerate(range(0, len(bins), per)):
                group = bins[b0 : b0 + per]
                name = shard_dir_name(k)
                w = MemmapShardWriter(
                    os.path.join(out_dir, name), len(group), pack_size, sum(len(g) for g in group)
                )
                for j, seqs in enumerate(group):
                    n, starts = materialize_bin_arrays(
                        src.read_sequence, seqs, pack_size, scratch_ids, scratch_mask
                    )
                    w.write_bin(j, scratch_ids[:n], scratch_mask[:n], starts)
                    for s, st in zip(seqs, starts):
                        pid, sid = src.ids[s]
                        ln = min(int(src.lengths[s]), pack_size)
                        seqf.write(
                            json.dumps(
                                {
                                    "shard": name,
                                    "bin": j,
                                    "start": int(st),
                                    "length": ln,
                                    "prompt_id": pid,
                                    "sample_id": sid,
                                    "truncated": bool(src.lengths[s] > pack_size),
                                }
                            )
                            + "\n"
                        )
                w.finalize()
                shards.append(name)
            seqf.flush()
            os.fsync(seqf.fileno())
    finally:
        src.close()
    os.replace(seq_tmp, os.path.join(out_dir, SEQUENCES))
    summary = {
        "format": FORMAT,
        "source": os.path.abspath(os.fspath(consolidated_dir)),
        "select": select if isinstance(select, str) else getattr(select, "__name__", "callable"),
        "pack_size": int(pack_size),
        "num_sequences": len(src),
        "num_truncated": int((src.lengths > pack_size).sum()),
        "num_bins": len(bins),
        "shards": shards,
        "loss_mask_roll": 1,
    }
    atomic_write_json(os.path.join(out_dir, EXPORT), summary)
    log.info(
        "packed %d sequences into %d bins (%d shards) in %s",
        len(src),
        len(bins),
        len(shards),
        out_dir,
    )
    return summary

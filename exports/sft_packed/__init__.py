"""``sft-packed``: seed 004's memmap padded fixed-shape + CSR packed SFT format.

Normative description: docs/formats/sft-packed.md. One shard directory::

    input_ids.npy  int32[num_bins, pack_size]   loss_mask.npy  uint8[num_bins, pack_size]
    packed_len.npy uint32[num_bins]             seq_offsets.npy uint32[num_bins + 1] (CSR)
    seq_starts.npy uint32[total_seq_starts]     manifest.json

One module a concept:

- :mod:`.layout` — the format's names, array dtypes and the keys of its JSON files;
- :mod:`.writer` — ``MemmapShardWriter`` pre-allocates ``.npy.tmp`` memmaps and renames them at
  ``finalize``;
- :mod:`.packing` — first-fit-decreasing bins, a bin's arrays (loss mask rolled by one, seed
  004 §1.2);
- :mod:`.source` — the selected token sequences of ``consolidated/``, read with bounded memory;
- :mod:`.export` — ``export_sft``: ``consolidated/`` → shards, ``export.json``,
  ``sequences.jsonl``;
- :mod:`.dataset` — ``PackedSftDataset`` opens memmaps lazily per DataLoader worker and drops
  them when pickled; ``PackedSftMultiShardDataset`` concatenates shards by cumulative offsets;
- :mod:`.legacy` — ``convert_legacy_to_memmap`` reads a legacy pickle-of-dicts ``.npy`` (it
  unpickles, so it only ever reads a file the user names).
"""

from hallulog.exports.sft_packed.dataset import (
    PackedSftDataset,
    PackedSftMultiShardDataset,
    collate_packed_sft,
    open_packed_sft,
)
from hallulog.exports.sft_packed.export import export_sft
from hallulog.exports.sft_packed.layout import (
    ARRAYS,
    EXPORT_FIELDS,
    FORMAT,
    MANIFEST_FIELDS,
    SEQUENCE_FIELDS,
    VERSION,
    shard_dir_name,
)
from hallulog.exports.sft_packed.legacy import convert_legacy_to_memmap
from hallulog.exports.sft_packed.packing import first_fit_decreasing, materialize_bin_arrays
from hallulog.exports.sft_packed.writer import MemmapShardWriter

__all__ = [
    "MemmapShardWriter",
    "materialize_bin_arrays",
    "first_fit_decreasing",
    "export_sft",
    "PackedSftDataset",
    "PackedSftMultiShardDataset",
    "open_packed_sft",
    "collate_packed_sft",
    "convert_legacy_to_memmap",
    "FORMAT",
    "VERSION",
    "ARRAYS",
    "MANIFEST_FIELDS",
    "EXPORT_FIELDS",
    "SEQUENCE_FIELDS",
    "shard_dir_name",
]

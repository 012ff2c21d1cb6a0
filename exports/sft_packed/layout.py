"""The sft-packed format's names: array files and dtypes, and the keys of its JSON files
(docs/formats/sft-packed.md; the tables there are checked against these)."""

from __future__ import annotations

__all__ = [
    "FORMAT",
    "VERSION",
    "ARRAYS",
    "MANIFEST",
    "EXPORT",
    "SEQUENCES",
    "MANIFEST_FIELDS",
    "EXPORT_FIELDS",
    "SEQUENCE_FIELDS",
    "shard_dir_name",
    "array_file",
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
MANIFEST = "manifest.json"
"""A shard's manifest (written last: a shard without one is not finalized)."""
EXPORT = "export.json"
"""The export's provenance, next to the shards."""
SEQUENCES = "sequences.jsonl"
"""Where each sequence landed, next to the shards."""
#: manifest.json keys (table "manifest.json"), seed 004 §1.1
MANIFEST_FIELDS = (
    "version",
    "format",
    "num_bins",
    "pack_size",
    "dtype",
    "loss_mask_dtype",
    "index_dtype",
    "bins_written",
)
#: export.json keys written next to the shards by export_sft (table "export.json")
EXPORT_FIELDS = (
    "format",
    "source",
    "select",
    "pack_size",
    "num_sequences",
    "num_truncated",
    "num_bins",
    "shards",
    "loss_mask_roll",
)
#: sequences.jsonl keys (table "sequences.jsonl")
SEQUENCE_FIELDS = ("shard", "bin", "start", "length", "prompt_id", "sample_id", "truncated")


def shard_dir_name(k: int) -> str:
    return f"shard_{k:06d}"


def array_file(name: str) -> str:
    """The file of array ``name`` (one of :data:`ARRAYS`)."""
    return f"{name}.npy"

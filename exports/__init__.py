"""What a finished run is exported as: the detector method inputs, WebDataset shards, saev and
SAELens activations, a packed SFT dataset, and the inputs of LM-Polygraph's estimators and
UQLM's scorers (``hallulog export``)."""

from hallulog.exports.lm_polygraph import export_lm_polygraph, load_stats
from hallulog.exports.saelens import export_saelens
from hallulog.exports.saev import SaevReader, export_saev
from hallulog.exports.sft_packed import (
    MemmapShardWriter,
    PackedSftDataset,
    PackedSftMultiShardDataset,
    collate_packed_sft,
    convert_legacy_to_memmap,
    export_sft,
    first_fit_decreasing,
    open_packed_sft,
)
from hallulog.exports.uqlm import export_uqlm, load_uqlm
from hallulog.exports.wds import export_wds, read_wds_manifest


def __getattr__(name):  # torch is imported only by those who use the Dataset
    if name == "WdsPairsDataset":
        from hallulog.exports.wds_dataset import WdsPairsDataset

        return WdsPairsDataset
    raise AttributeError(f"module 'hallulog.exports' has no attribute {name!r}")


__all__ = [
    "export_wds",
    "read_wds_manifest",
    "WdsPairsDataset",
    "export_saev",
    "SaevReader",
    "export_saelens",
    "export_sft",
    "MemmapShardWriter",
    "PackedSftDataset",
    "PackedSftMultiShardDataset",
    "open_packed_sft",
    "collate_packed_sft",
    "convert_legacy_to_memmap",
    "first_fit_decreasing",
    "export_lm_polygraph",
    "load_stats",
    "export_uqlm",
    "load_uqlm",
]

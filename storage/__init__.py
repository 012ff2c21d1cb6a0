"""hallulog's activation store: formats, one reader interface, converters, PyTorch datasets.

Formats (normative docs in docs/formats/): ``packed`` (CSR shards, the fast one), ``zarr``
(seed 000, Zarr v2; v3 + sharding as an option), ``npy`` (seed 003 §6.4). Element dtypes:
float16, float32, bfloat16 (``storage.dtypes``: read back as ``ml_dtypes.bfloat16`` arrays and
``torch.bfloat16`` tensors). ``storage`` imports nothing from the rest of hallulog but
``contracts`` (the artifact layout, JSONL, the error root).

    from storage import open_writer, SampleMeta, open_store, ActivationPairsDataset, collate_pairs
"""

from .base import ActivationReader, ActivationWriter, SampleMeta
from .convert import convert_store, merge_stores
from .errors import (
    CorruptShardError,
    ManifestError,
    StorageError,
    StoreNotFoundError,
    UnknownFormatError,
)
from .multi import MultiReader
from .registry import (
    FORMATS,
    StorageFormat,
    detect_format,
    open_store,
    open_writer,
    store_dir,
    write_multi_manifest,
)
from .saelens import export_saelens
from .saev import SaevReader, export_saev
from .sft_packed import (
    MemmapShardWriter,
    PackedSftDataset,
    PackedSftMultiShardDataset,
    collate_packed_sft,
    convert_legacy_to_memmap,
    export_sft,
    first_fit_decreasing,
    open_packed_sft,
)
from .wds import export_wds, read_wds_manifest


def __getattr__(name):  # torch is imported only by those who use the Dataset
    if name in ("ActivationPairsDataset", "collate_pairs"):
        from . import dataset

        return getattr(dataset, name)
    if name == "WdsPairsDataset":
        from .wds_dataset import WdsPairsDataset

        return WdsPairsDataset
    raise AttributeError(f"module 'storage' has no attribute {name!r}")


__all__ = [
    "FORMATS",
    "StorageFormat",
    "ActivationPairsDataset",
    "ActivationReader",
    "ActivationWriter",
    "CorruptShardError",
    "ManifestError",
    "MultiReader",
    "SampleMeta",
    "StorageError",
    "StoreNotFoundError",
    "UnknownFormatError",
    "collate_pairs",
    "convert_store",
    "detect_format",
    "merge_stores",
    "open_store",
    "open_writer",
    "store_dir",
    "write_multi_manifest",
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
]

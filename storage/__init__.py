"""hallulog's activation store: formats, one reader interface, converters, PyTorch datasets.

Formats (normative docs in docs/formats/): ``packed`` (CSR shards, the fast one), ``zarr``
(seed 000, Zarr v2; v3 + sharding as an option), ``npy`` (seed 003 §6.4). Element dtypes:
float16, float32, bfloat16 (``hallulog.storage.dtypes``: read back as ``ml_dtypes.bfloat16`` arrays and
``torch.bfloat16`` tensors). ``storage`` imports nothing from the rest of hallulog but
``contracts`` (the artifact layout, JSONL, the error root).

    from hallulog.storage import open_writer, SampleMeta, open_store, ActivationPairsDataset, collate_pairs
"""

from hallulog.storage.base import ActivationReader, ActivationWriter, SampleMeta
from hallulog.storage.convert import convert_store, merge_stores
from hallulog.storage.errors import (
    CorruptShardError,
    ManifestError,
    StorageError,
    StoreNotFoundError,
    UnknownFormatError,
)
from hallulog.storage.multi import MultiReader
from hallulog.storage.registry import (
    FORMATS,
    StorageFormat,
    detect_format,
    open_store,
    open_writer,
    store_dir,
    write_multi_manifest,
)


def __getattr__(name):  # torch is imported only by those who use the Dataset
    if name in ("ActivationPairsDataset", "collate_pairs"):
        from hallulog.storage import dataset

        return getattr(dataset, name)
    raise AttributeError(f"module 'hallulog.storage' has no attribute {name!r}")


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
]

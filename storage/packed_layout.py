"""The ``packed`` format's names and layout constants (docs/formats/packed.md): file names,
manifest and commit-log fields, index arrays, and the manifest's content hash."""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Callable

import google_crc32c
import numpy as np
from hallulog.storage._commitlog import COMMIT_LOG, record_line_bytes

__all__ = [
    "FORMAT",
    "SCHEMA_VERSION",
    "MANIFEST",
    "CHECKSUMS",
    "DEFAULT_CHECKSUM",
    "checksum_name",
    "ADDED_IN_SCHEMA_2",
    "COMMIT_LOG",
    "DEFAULT_SHARD_BYTES",
    "MANIFEST_FIELDS",
    "SHARD_FIELDS",
    "INDEX_ARRAYS",
    "LOCATION_FIELDS",
    "HEADER_FIELDS",
    "RECORD_FIELDS",
    "shard_name",
    "hash_content",
    "hashed_head",
    "sample_bytes",
]

FORMAT = "hallulog.packed"
#: 2: the ``checksum`` field (``crc32c`` for new stores); 1: no such field, zlib's ``crc32``
SCHEMA_VERSION = 2
MANIFEST = "manifest.json"
DEFAULT_SHARD_BYTES = 2 << 30

#: the per-sample checksum's name -> the function of a sample's bytes. crc32c: CRC-32 with the
#: Castagnoli polynomial (SSE4.2 / ARMv8 instructions, ~13 GB/s here against zlib's ~3 GB/s)
CHECKSUMS: dict[str, Callable[[object], int]] = {"crc32": zlib.crc32, "crc32c": google_crc32c.value}
DEFAULT_CHECKSUM = "crc32c"

#: manifest.json keys (docs/formats/packed.md, table "manifest.json")
MANIFEST_FIELDS = (
    "schema_version",
    "format",
    "dtype",
    "layer_ids",
    "hidden_size",
    "num_samples",
    "num_tokens",
    "shard_bytes",
    "checksum",
    "shards",
    "index_arrays",
    "content_hash",
    "created_unix",
)
#: fields a schema-1 manifest or commit-log header lacks
ADDED_IN_SCHEMA_2 = ("checksum",)
#: one entry of manifest["shards"] (table "shards[]")
SHARD_FIELDS = ("file", "num_samples", "size_bytes")
#: index arrays: name -> dtype (table "index arrays")
INDEX_ARRAYS = {
    "token_offsets": "<i8",
    "shard_index": "<i4",
    "byte_offsets": "<i8",
    "prompt_len": "<i4",
    "response_len": "<i4",
    "label": "|i1",
    "crc32": "<u4",
    "sample_key": "|S",
}
#: keys of the dict PackedWriter.write returns (table "writer location fields")
LOCATION_FIELDS = ("file_path", "byte_offset", "shape", "dtype", "size_bytes")
#: commit.log first line (table "commit.log header")
HEADER_FIELDS = (
    "schema_version",
    "format",
    "dtype",
    "layer_ids",
    "hidden_size",
    "shard_bytes",
    "checksum",
)
#: commit.log record lines (table "commit.log records")
RECORD_FIELDS = (
    "key",
    "shard",
    "offset",
    "seq_len",
    "prompt_len",
    "response_len",
    "label",
    "crc32",
)


def shard_name(k: int) -> str:
    return f"shard_{k:06d}.bin"


def hash_content(head: dict, arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256(json.dumps(head, sort_keys=True, separators=(",", ":")).encode())
    for name in INDEX_ARRAYS:
        a = np.ascontiguousarray(arrays[name])
        h.update(name.encode() + a.dtype.str.encode() + str(a.shape).encode())
        h.update(a.tobytes())
    return "sha256:" + h.hexdigest()


def checksum_name(head: dict) -> str:
    """The checksum a manifest or commit-log header names (schema 1: zlib's ``crc32``)."""
    name = head.get("checksum", "crc32") if head.get("schema_version", 1) >= 2 else "crc32"
    if name not in CHECKSUMS:
        raise ValueError(f"unknown checksum {name!r} (known: {sorted(CHECKSUMS)})")
    return name


def hashed_head(m: dict) -> dict:
    keys = (
        "schema_version",
        "format",
        "dtype",
        "layer_ids",
        "hidden_size",
        "num_samples",
        "num_tokens",
        "shards",
    ) + (ADDED_IN_SCHEMA_2 if m["schema_version"] >= 2 else ())
    return {k: m[k] for k in keys}


def sample_bytes(
    *, layers: int, rows: float, hidden_size: int, itemsize: int, key_len: int
) -> float:
    """Bytes one stored sample costs (a projection): its rows in a shard, its commit-log line,
    its entries in the index arrays and its key."""
    data = layers * rows * hidden_size * itemsize
    index = sum(np.dtype(d).itemsize for name, d in INDEX_ARRAYS.items() if name != "sample_key")
    return data + record_line_bytes(key_len, rows) + index + key_len

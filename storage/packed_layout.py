"""The ``packed`` format's names and layout constants (docs/formats/packed.md): file names,
manifest and commit-log fields, index arrays, and the manifest's content hash."""

from __future__ import annotations

import hashlib
import json

import numpy as np

__all__ = ["FORMAT", "SCHEMA_VERSION", "MANIFEST", "COMMIT_LOG", "DEFAULT_SHARD_BYTES", "MANIFEST_FIELDS", "SHARD_FIELDS", "INDEX_ARRAYS", "LOCATION_FIELDS", "HEADER_FIELDS", "RECORD_FIELDS", "shard_name", "_hash_content", "_hashed_head"]

FORMAT = "hallulog.packed"
SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
COMMIT_LOG = "commit.log"
DEFAULT_SHARD_BYTES = 2 << 30

#: manifest.json keys (docs/formats/packed.md, table "manifest.json")
MANIFEST_FIELDS = (
    "schema_version", "format", "dtype", "layer_ids", "hidden_size", "num_samples",
    "num_tokens", "shard_bytes", "shards", "index_arrays", "content_hash", "created_unix",
)
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
HEADER_FIELDS = ("schema_version", "format", "dtype", "layer_ids", "hidden_size", "shard_bytes")
#: commit.log record lines (table "commit.log records")
RECORD_FIELDS = ("key", "shard", "offset", "seq_len", "prompt_len", "response_len", "label", "crc32")


def shard_name(k: int) -> str:
    return f"shard_{k:06d}.bin"


def _hash_content(head: dict, arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256(json.dumps(head, sort_keys=True, separators=(",", ":")).encode())
    for name in INDEX_ARRAYS:
        a = np.ascontiguousarray(arrays[name])
        h.update(name.encode() + a.dtype.str.encode() + str(a.shape).encode())
        h.update(a.tobytes())
    return "sha256:" + h.hexdigest()


def _hashed_head(m: dict) -> dict:
    keys = ("schema_version", "format", "dtype", "layer_ids", "hidden_size", "num_samples", "num_tokens", "shards")
    return {k: m[k] for k in keys}

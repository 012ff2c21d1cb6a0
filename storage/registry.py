"""Format names, ``open_writer`` and ``open_store`` (format detection)."""

from __future__ import annotations

import json
import os

from .base import ActivationReader, ActivationWriter
from .errors import ManifestError, UnknownFormatError

__all__ = ["FORMATS", "open_writer", "open_store", "detect_format", "store_dir", "write_multi_manifest"]

FORMATS = ("npy", "packed", "zarr")
ACTIVATIONS_DIR = "activations"


def store_dir(root) -> str:
    """Where a writer opened on ``root`` (a worker directory) keeps its data."""
    return os.path.join(os.fspath(root), ACTIVATIONS_DIR)


def open_writer(fmt: str, root, layer_ids, hidden_size: int, dtype="float16", **options) -> ActivationWriter:
    """Open (or reopen, recovering after a crash) the ``fmt`` writer of ``root/activations/``.

    ``dtype``: ``float16``, ``float32`` or ``bfloat16`` (``storage.dtypes``), by name or dtype.

    ``options``: packed ``shard_bytes``; zarr ``t_chunk``, ``zarr_format`` (2 or 3),
    ``sharded`` (zarr v3 sharding codec), ``model_id``.
    """
    path = store_dir(root)
    if fmt == "packed":
        from .packed import PackedWriter as cls
    elif fmt == "zarr":
        from .zarr_store import ZarrWriter as cls
    elif fmt == "npy":
        from .npy import NpyWriter as cls
    else:
        raise ValueError(f"unknown storage format {fmt!r}; choose one of {FORMATS}")
    return cls(path, layer_ids=layer_ids, hidden_size=hidden_size, dtype=dtype, **options)


def _manifest_format(path: str) -> str | None:
    m = os.path.join(path, "manifest.json")
    if not os.path.isfile(m):
        return None
    try:
        with open(m) as f:
            fmt = json.load(f).get("format")
    except (ValueError, AttributeError) as e:
        raise ManifestError(f"unparsable manifest ({e})", m) from None
    return fmt


def detect_format(path) -> tuple[str, str]:
    """``(format, store path)`` for a store, a worker directory or a consolidated directory."""
    path = os.fspath(path)
    for cand in (path, store_dir(path)):
        fmt = _manifest_format(cand)
        if fmt == "hallulog.packed":
            return "packed", cand
        if fmt == "hallulog.multi":
            return "multi", cand
        if os.path.exists(os.path.join(cand, "commit.log")) and os.path.exists(os.path.join(cand, "shard_000000.bin")):
            return "packed", cand  # unfinalized: the reader says how to recover
        for z in (cand, os.path.join(cand, "activations.zarr")):
            if os.path.exists(os.path.join(z, ".zgroup")) or os.path.exists(os.path.join(z, "zarr.json")):
                return "zarr", z
    if os.path.exists(os.path.join(path, "activation_index.jsonl")):
        return "npy", path
    raise UnknownFormatError("no packed, zarr or npy activation store here", path)


def open_store(path, **options) -> ActivationReader:
    """Open any store read-only; see ``detect_format`` for what ``path`` may point at."""
    fmt, where = detect_format(path)
    if fmt == "packed":
        from .packed import PackedReader

        return PackedReader(where, **options)
    if fmt == "zarr":
        from .zarr_store import ZarrReader

        return ZarrReader(where)
    if fmt == "multi":
        from .multi import MultiReader, check_manifest

        with open(os.path.join(where, "manifest.json")) as f:
            manifest = json.load(f)
        check_manifest(where, manifest)
        return MultiReader(where, manifest, [open_store(os.path.join(where, s)) for s in manifest["stores"]])
    from .npy import NpyReader

    return NpyReader(where)


def write_multi_manifest(out_dir, store_dirs, check_unique_keys: bool = True) -> dict:
    """Write ``out_dir/manifest.json`` listing ``store_dirs`` (seed 000 Option A); returns it.

    Paths are stored relative to ``out_dir``; see ``multi.build_manifest`` for the checks.
    """
    from .multi import build_manifest, write_manifest

    out_dir = os.path.abspath(os.fspath(out_dir))
    os.makedirs(out_dir, exist_ok=True)
    readers = [open_store(d) for d in store_dirs]
    try:
        manifest = build_manifest(out_dir, store_dirs, readers, check_unique_keys)
    finally:
        for r in readers:
            r.close()
    write_manifest(out_dir, manifest)
    return manifest

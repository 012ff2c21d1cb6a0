"""Streaming converters between formats; a multi-store source makes them a physical merge.

Memory is bounded by one sample (all its layers): the source is read sample by sample and
written straight to the destination writer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from hallulog.storage._io import fsync_dir
from hallulog.storage.base import ActivationReader, SampleMeta
from hallulog.storage.npy import INDEX_FILE, index_line
from hallulog.storage.registry import open_store, open_writer, write_multi_manifest

__all__ = ["convert_store", "merge_stores"]


def convert_store(src, dst_root, fmt: str, **writer_options) -> str:
    """Copy every sample of ``src`` (a path or a reader) into a new ``fmt`` store at ``dst_root``.

    ``dst_root`` is laid out like a worker directory: ``dst_root/activations/`` holds the store
    and, for npy, ``dst_root/activation_index.jsonl`` the index. Returns ``dst_root``.
    """
    reader = src if isinstance(src, ActivationReader) else open_store(src)
    dst_root = os.fspath(dst_root)
    os.makedirs(dst_root, exist_ok=True)
    writer = open_writer(
        fmt,
        dst_root,
        layer_ids=reader.layer_ids,
        hidden_size=reader.hidden_size,
        dtype=reader.dtype,
        **writer_options,
    )
    if writer.committed_keys():
        writer.rollback(set())
    index = open(os.path.join(dst_root, INDEX_FILE + ".tmp"), "w") if fmt == "npy" else None
    try:
        for i in range(len(reader)):
            m = reader.meta(i)
            acts = reader.read_sample(i)
            writer.write(
                m["sample_key"], acts, SampleMeta(m["prompt_len"], m["response_len"], m["label"])
            )
            if index is not None:
                index.write(
                    json.dumps(
                        index_line(
                            m["sample_key"], m, reader.layer_ids, reader.hidden_size, reader.dtype
                        )
                    )
                    + "\n"
                )
    finally:
        writer.close()
        if index is not None:
            index.flush()
            os.fsync(index.fileno())
            index.close()
    if index is not None:
        os.replace(index.name, os.path.join(dst_root, INDEX_FILE))
        fsync_dir(dst_root)
    if reader is not src:
        reader.close()
    return dst_root


def merge_stores(store_dirs: Sequence, dst_root, fmt: str = "zarr", **writer_options) -> str:
    """Seed 000 Option B: physically merge several stores into one ``fmt`` store."""
    import tempfile

    with tempfile.TemporaryDirectory(
        dir=os.fspath(dst_root) if os.path.isdir(dst_root) else None
    ) as tmp:
        write_multi_manifest(tmp, store_dirs)
        reader = open_store(tmp)
        try:
            return convert_store(reader, dst_root, fmt, **writer_options)
        finally:
            reader.close()

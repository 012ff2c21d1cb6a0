"""Several stores read as one (seed 000 Option A): ``manifest.json`` with ``format: hallulog.multi``.

Normative description: docs/formats/packed.md, section "Multi-store manifest" (it serves every
format). Consolidation writes one over the per-worker stores instead of copying their bytes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from hallulog.storage._io import atomic_write_json
from hallulog.storage.base import ActivationReader
from hallulog.storage.dtypes import dtype_str, store_dtype
from hallulog.storage.errors import ManifestError, StorageError

__all__ = ["MultiReader", "build_manifest", "write_manifest", "check_manifest", "FORMAT"]

FORMAT = "hallulog.multi"
SCHEMA_VERSION = 1
#: manifest.json keys of a multi-store manifest (table "multi-store manifest.json")
MANIFEST_FIELDS = (
    "schema_version",
    "format",
    "stores",
    "num_samples",
    "layer_ids",
    "hidden_size",
    "dtype",
)


def build_manifest(
    out_dir: str,
    store_dirs: Sequence,
    readers: Sequence[ActivationReader],
    check_unique_keys: bool = True,
) -> dict:
    """The manifest listing ``store_dirs`` (already opened as ``readers``), relative to ``out_dir``.

    Every store must have the same layer ids, hidden size and dtype; with ``check_unique_keys``
    a sample key present in two stores is an error. ``registry.write_multi_manifest`` opens the
    stores and writes the file (this module opens no store: no import cycle with the registry).
    """
    if not readers:
        raise StorageError("write_multi_manifest needs at least one store", out_dir)
    first = readers[0]
    seen: dict[str, str] = {}
    for r in readers:
        if (r.layer_ids, r.hidden_size, r.dtype) != (
            first.layer_ids,
            first.hidden_size,
            first.dtype,
        ):
            raise StorageError(
                f"store has layers/hidden/dtype {r.layer_ids, r.hidden_size, r.dtype}, "
                f"first store {first.path} has {first.layer_ids, first.hidden_size, first.dtype}",
                r.path,
            )
        if check_unique_keys:
            for k in r.keys():
                if k in seen:
                    raise StorageError(f"sample {k} is in both {seen[k]} and this store", r.path)
                seen[k] = r.path
    return {
        "schema_version": SCHEMA_VERSION,
        "format": FORMAT,
        "stores": [os.path.relpath(os.path.abspath(os.fspath(d)), out_dir) for d in store_dirs],
        "num_samples": [len(r) for r in readers],
        "layer_ids": first.layer_ids,
        "hidden_size": first.hidden_size,
        "dtype": dtype_str(first.dtype),
    }


def write_manifest(out_dir: str, manifest: dict) -> None:
    atomic_write_json(os.path.join(out_dir, "manifest.json"), manifest)


def check_manifest(path: str, manifest: dict) -> None:
    """``ManifestError`` naming ``path/manifest.json`` when a key is missing."""
    missing = [k for k in MANIFEST_FIELDS if k not in manifest]
    if missing:
        raise ManifestError(
            f"multi-store manifest lacks {missing}", os.path.join(path, "manifest.json")
        )


class MultiReader(ActivationReader):
    """The stores of a multi-store manifest read as one; ``readers`` are its stores, opened in order
    (``hallulog.storage.open_store`` on the manifest's directory builds one)."""

    def __init__(self, path, manifest: dict, readers: Sequence[ActivationReader]):
        self.path = os.fspath(path)
        mpath = os.path.join(self.path, "manifest.json")
        check_manifest(self.path, manifest)
        self.readers = list(readers)
        if len(self.readers) != len(manifest["stores"]):
            raise ManifestError(
                f"{len(self.readers)} readers for {len(manifest['stores'])} stores", mpath
            )
        for r, n in zip(self.readers, manifest["num_samples"]):
            if len(r) != n:
                raise ManifestError(
                    f"store {r.path} holds {len(r)} samples, manifest says {n}", mpath
                )
            if (r.layer_ids, r.hidden_size, dtype_str(r.dtype)) != (
                manifest["layer_ids"],
                manifest["hidden_size"],
                manifest["dtype"],
            ):
                raise ManifestError(
                    f"store {r.path} differs in layers/hidden/dtype from the manifest", mpath
                )
        self.layer_ids = list(manifest["layer_ids"])
        self.hidden_size = int(manifest["hidden_size"])
        try:
            self.dtype = store_dtype(manifest["dtype"])
        except ValueError as exc:
            raise ManifestError(str(exc), mpath) from None
        self._starts = np.concatenate([[0], np.cumsum(manifest["num_samples"])]).astype(np.int64)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _locate(self, i: int) -> tuple[int, int]:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range for {n} samples in {self.path}")
        i %= n
        s = int(np.searchsorted(self._starts, i, side="right")) - 1
        return s, i - int(self._starts[s])

    def meta(self, i: int) -> dict:
        s, j = self._locate(i)
        return self.readers[s].meta(j)

    def seq_len(self, i: int) -> int:
        s, j = self._locate(i)
        return self.readers[s].seq_len(j)

    def keys(self) -> list[str]:
        return [k for r in self.readers for k in r.keys()]

    def read(self, i: int, layer: int) -> np.ndarray:
        s, j = self._locate(i)
        return self.readers[s].read(j, layer)

    def read_pairs(self, samples, layers) -> list[np.ndarray]:
        groups: dict[int, list] = {}
        for k, (i, l) in enumerate(zip(samples, layers)):
            s, j = self._locate(int(i))
            groups.setdefault(s, []).append((k, j, int(l)))
        out: list = [None] * sum(len(g) for g in groups.values())
        for s, g in groups.items():
            got = self.readers[s].read_pairs([j for _, j, _ in g], [l for _, _, l in g])
            for (k, _, _), a in zip(g, got):
                out[k] = a
        return out

    def read_pairs_into(self, samples, layers, outs) -> None:
        groups: dict[int, list] = {}
        for k, (i, l) in enumerate(zip(samples, layers)):
            s, j = self._locate(int(i))
            groups.setdefault(s, []).append((k, j, int(l)))
        for s, g in groups.items():
            self.readers[s].read_pairs_into(
                [j for _, j, _ in g], [l for _, _, l in g], [outs[k] for k, _, _ in g]
            )

    def verify(self) -> None:
        for r in self.readers:
            r.verify()

    def close(self) -> None:
        for r in self.readers:
            r.close()

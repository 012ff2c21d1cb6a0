"""``wds``: seed 002 Option A WebDataset export — one tar record per sample, all layers.

Normative description: docs/formats/wds.md. ``export_wds`` streams any store (through the
common reader) into ``wds-00000.tar …`` plus ``manifest.json`` and an optional ``samples.jsonl``
sidecar with the texts; every shard is written to ``.tmp`` and renamed when complete, the
manifest last. ``WdsPairsDataset`` streams the shards back with a shuffle buffer and returns
what ``ActivationPairsDataset`` returns (same layers for the same seed, epoch and sample index).

Records are plain ustar members, ``<key>.prompt_acts.npy``, ``<key>.response_acts.npy``,
``<key>.meta.json``: the ``webdataset`` library, ``tar`` and ``tarfile`` + numpy all read them.
Nothing here unpickles: ``.npy`` payloads are parsed with ``allow_pickle=False`` semantics.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import tarfile
import time
from collections.abc import Iterator, Mapping

import numpy as np
from hallulog.contracts.errors import MalformedLineError
from hallulog.contracts.jsonl import iter_lines
from hallulog.storage._io import atomic_write_json, fsync_dir, malformed_is_manifest_error
from hallulog.storage.base import ActivationReader
from hallulog.storage.dtypes import (
    as_container,
    container_dtype,
    dtype_str,
    from_container,
    store_dtype,
)
from hallulog.storage.errors import CorruptShardError, ManifestError, StorageError

log = logging.getLogger(__name__)

__all__ = ["export_wds", "read_wds_manifest", "iter_wds_records", "decode_npy", "FORMAT"]

FORMAT = "hallulog.wds"
SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
SAMPLES_JSONL = "samples.jsonl"
DEFAULT_SHARD_BYTES = 512 << 20

#: manifest.json keys (docs/formats/wds.md, table "manifest.json")
MANIFEST_FIELDS = (
    "schema_version",
    "format",
    "shards",
    "num_records",
    "layer_ids",
    "hidden_size",
    "dtype",
    "fixed_shapes",
    "P_max",
    "R_max",
    "shard_bytes",
    "source",
    "samples_jsonl",
    "created_unix",
)
#: one entry of manifest["shards"] (table "shards[]")
SHARD_FIELDS = ("file", "num_records", "size_bytes", "first_sample_index")
#: members of one record (table "record members")
RECORD_MEMBERS = ("prompt_acts.npy", "response_acts.npy", "meta.json")
#: meta.json keys (table "meta.json")
META_FIELDS = ("sample_index", "prompt_len", "response_len", "hallu_label", "split", "sample_key")
#: samples.jsonl keys (table "samples.jsonl")
TEXT_FIELDS = ("sample_index", "sample_key", "prompt", "response")


def shard_name(k: int) -> str:
    return f"wds-{k:05d}.tar"


def _npy_bytes(a: np.ndarray) -> bytes:
    """``.npy`` bytes of ``a``; a bfloat16 array as its ``<u2`` words (docs/formats/wds.md)."""
    buf = io.BytesIO()
    np.save(buf, as_container(np.ascontiguousarray(a)), allow_pickle=False)
    return buf.getvalue()


@malformed_is_manifest_error
def decode_npy(data: bytes, name: str = "<npy>", dtype=None) -> np.ndarray:
    """A read-only array view over ``.npy`` bytes; refuses object dtypes (no unpickling).

    ``dtype``: the export's dtype (its manifest's ``dtype``): the member must hold it, and a
    bfloat16 member's ``<u2`` words come back as an ``ml_dtypes.bfloat16`` view."""
    want = None if dtype is None else np.dtype(store_dtype(dtype))
    f = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f, max_header_size=1 << 16)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f, max_header_size=1 << 16)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except ValueError as e:
        raise CorruptShardError(f"bad .npy member ({e})", name) from None
    if dtype.hasobject:
        raise CorruptShardError("object-dtype .npy member refused (it would need unpickling)", name)
    n = int(np.prod(shape)) if shape else 1
    if len(data) - f.tell() < n * dtype.itemsize:
        raise CorruptShardError(f"truncated .npy member: {shape} {dtype}", name)
    if want is not None and dtype != container_dtype(want):
        raise CorruptShardError(
            f".npy member holds {dtype}, the export's dtype is {dtype_str(want)}", name
        )
    a = np.frombuffer(data, dtype=dtype, count=n, offset=f.tell())
    a = a.reshape(shape, order="F" if fortran else "C")
    return a if want is None else from_container(a, want)


def load_texts(texts) -> dict[str, dict]:
    """``texts``: a mapping ``sample_key -> {prompt, response}`` or a JSONL path whose lines
    carry ``sample_key`` (or ``activation_key``) and ``prompt`` / ``response``."""
    if texts is None:
        return {}
    if isinstance(texts, Mapping):
        return {str(k): dict(v) for k, v in texts.items()}
    path = os.fspath(texts)
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    out = {}
    try:
        for line in iter_lines(path):
            key = line.row.get("sample_key", line.row.get("activation_key"))
            if key is None:
                raise ManifestError(
                    "line has neither sample_key nor activation_key", path, line=line.lineno
                )
            out[str(key)] = line.row
    except MalformedLineError as exc:
        raise ManifestError("unparsable JSON line", path, line=exc.line) from None
    return out


class _TarShardWriter:
    """One ``wds-NNNNN.tar`` written as ``.tmp`` and renamed by ``close``."""

    def __init__(self, path: str):
        self.path, self.tmp = path, path + ".tmp"
        self.f = open(self.tmp, "wb")
        self.tar = tarfile.open(fileobj=self.f, mode="w", format=tarfile.USTAR_FORMAT)
        self.num_records = 0

    def add(self, key: str, members: dict[str, bytes]) -> None:
        for ext in RECORD_MEMBERS:
            data = members[ext]
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size, info.mode, info.mtime = len(data), 0o444, 0
            self.tar.addfile(info, io.BytesIO(data))
        self.num_records += 1

    @property
    def size(self) -> int:
        return self.f.tell()

    def close(self) -> int:
        self.tar.close()
        self.f.flush()
        os.fsync(self.f.fileno())
        size = self.f.tell()
        self.f.close()
        os.replace(self.tmp, self.path)
        return size


def export_wds(
    src,
    dst,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    texts=None,
    split: str | None = None,
    fixed_shapes: bool = False,
) -> dict:
    """Convert the store at ``src`` (any format, or an open reader) into WDS shards in ``dst``.

    ``shard_bytes``: a shard is closed before a record would take it past this size (a record
    never spans shards; seed 002 suggests 256–1024 MB). ``texts``: see :func:`load_texts`;
    when given, ``samples.jsonl`` is written. ``split`` goes into every ``meta.json``.
    ``fixed_shapes`` pads every record to the store-wide ``P_max`` / ``R_max`` (zeros) instead
    of the sample's own lengths. Returns the manifest.
    """
    from hallulog.storage.registry import open_store

    reader = src if isinstance(src, ActivationReader) else open_store(src)
    dst = os.fspath(dst)
    os.makedirs(dst, exist_ok=True)
    if os.path.exists(os.path.join(dst, MANIFEST)):
        os.unlink(os.path.join(dst, MANIFEST))  # a rewrite: no reader may see a stale view
    texts_by_key = load_texts(texts)
    n, L, H = len(reader), reader.num_layers, reader.hidden_size
    metas = [reader.meta(i) for i in range(n)]
    for m in metas:
        if "." in m["sample_key"] or "/" in m["sample_key"]:
            raise StorageError(
                f"sample key {m['sample_key']!r} has '.' or '/': not a valid WebDataset key",
                reader.path,
            )
    p_max = max((m["prompt_len"] for m in metas), default=0)
    r_max = max((m["response_len"] for m in metas), default=0)
    shards: list[dict] = []
    w: _TarShardWriter | None = None
    first = 0
    text_tmp = os.path.join(dst, SAMPLES_JSONL + ".tmp")
    tf = open(text_tmp, "w", encoding="utf-8") if texts_by_key else None

    def close_shard():
        size = w.close()
        shards.append(
            {
                "file": os.path.basename(w.path),
                "num_records": w.num_records,
                "size_bytes": size,
                "first_sample_index": first,
            }
        )

    try:
        for i, m in enumerate(metas):
            acts = reader.read_sample(i)  # (L, T, H)
            p, r = m["prompt_len"], m["response_len"]
            if fixed_shapes:
                pa = np.zeros((L, p_max, H), reader.dtype)
                ra = np.zeros((L, r_max, H), reader.dtype)
                pa[:, :p], ra[:, :r] = acts[:, :p], acts[:, p : p + r]
            else:
                pa, ra = acts[:, :p], acts[:, p : p + r]
            meta = {
                "sample_index": i,
                "prompt_len": p,
                "response_len": r,
                "hallu_label": m["label"],
                "split": split,
                "sample_key": m["sample_key"],
            }
            members = {
                "prompt_acts.npy": _npy_bytes(pa),
                "response_acts.npy": _npy_bytes(ra),
                "meta.json": json.dumps(meta, sort_keys=True).encode(),
            }
            rec_bytes = sum(len(b) + 1024 for b in members.values())
            if w is not None and w.num_records and w.size + rec_bytes > shard_bytes:
                close_shard()
                w = None
            if w is None:
                first = i
                w = _TarShardWriter(os.path.join(dst, shard_name(len(shards))))
            w.add(m["sample_key"], members)
            if tf is not None:
                t = texts_by_key.get(m["sample_key"], {})
                tf.write(
                    json.dumps(
                        {
                            "sample_index": i,
                            "sample_key": m["sample_key"],
                            "prompt": t.get("prompt"),
                            "response": t.get("response"),
                        }
                    )
                    + "\n"
                )
        if w is not None:
            close_shard()
    finally:
        if tf is not None:
            tf.flush()
            os.fsync(tf.fileno())
            tf.close()
    if tf is not None:
        os.replace(text_tmp, os.path.join(dst, SAMPLES_JSONL))
    fsync_dir(dst)
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "format": FORMAT,
        "shards": shards,
        "num_records": n,
        "layer_ids": list(reader.layer_ids),
        "hidden_size": H,
        "dtype": dtype_str(reader.dtype),
        "fixed_shapes": bool(fixed_shapes),
        "P_max": p_max,
        "R_max": r_max,
        "shard_bytes": int(shard_bytes),
        "source": os.path.abspath(reader.path),
        "samples_jsonl": SAMPLES_JSONL if tf is not None else None,
        "created_unix": int(time.time()),
    }
    atomic_write_json(os.path.join(dst, MANIFEST), manifest)
    log.info("wrote %d records in %d WDS shards to %s", n, len(shards), dst)
    return manifest


@malformed_is_manifest_error
def read_wds_manifest(path) -> dict:
    mpath = os.path.join(os.fspath(path), MANIFEST)
    try:
        with open(mpath) as f:
            m = json.load(f)
    except FileNotFoundError:
        raise ManifestError(
            "no WDS manifest: export not finished (rerun export_wds)", mpath
        ) from None
    except ValueError as e:
        raise ManifestError(f"unparsable manifest ({e})", mpath) from None
    missing = [k for k in MANIFEST_FIELDS if k not in m]
    if missing or m.get("format") != FORMAT:
        raise ManifestError(f"not a {FORMAT} manifest (lacks {missing})", mpath)
    if sum(s["num_records"] for s in m["shards"]) != m["num_records"]:
        raise ManifestError("shard record counts do not add up to num_records", mpath)
    return m


@malformed_is_manifest_error
def iter_wds_records(tar_path: str, backend: str = "tarfile") -> Iterator[dict]:
    """Records of one shard as ``{"__key__", "prompt_acts.npy", "response_acts.npy", "meta.json"}``
    (raw bytes), streaming: the shard is opened once and read front to back."""
    if backend == "webdataset":
        import webdataset as wds

        ds = wds.WebDataset(
            [tar_path],
            shardshuffle=False,
            nodesplitter=None,
            workersplitter=None,
            empty_check=False,
        )
        for rec in ds:
            yield {k: v for k, v in rec.items() if k == "__key__" or k in RECORD_MEMBERS}
        return
    if backend != "tarfile":
        raise ValueError(f"unknown backend {backend!r} (tarfile or webdataset)")
    cur: dict = {}
    try:
        with open(tar_path, "rb") as f, tarfile.open(fileobj=f, mode="r|") as tar:
            for info in tar:
                if not info.isfile():
                    continue
                key, _, ext = info.name.rpartition("/")[2].partition(".")
                if cur and cur["__key__"] != key:
                    yield cur
                    cur = {}
                cur["__key__"] = key
                cur[ext] = tar.extractfile(info).read()
    except tarfile.TarError as e:
        raise CorruptShardError(f"unreadable tar shard ({e})", tar_path) from None
    if cur:
        yield cur

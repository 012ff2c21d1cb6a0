"""Reading activation stores straight from a bucket: ``open_store("s3://bucket/prefix/...")``.

- ``packed``: :class:`BucketPackedReader` is the packed reader with its bytes from the bucket.
  The small metadata (``manifest.json`` and the index arrays) is fetched once into a local cache
  directory and checked exactly as on disk (fields, sizes against the bucket's listing, content
  hash); every (sample, layer) slice is then a byte range of a shard object, read by the
  coalescing planner of ``hallulog.storage._ranged`` through :class:`BucketFiles` (one ranged GET per
  planned range, many in flight).
- ``multi`` (``consolidated/activations``): the manifest's stores resolved as keys beside it.
- ``zarr``: zarr's own object-store support (``zarr.storage.ObjectStore`` over the obstore
  client), under the same checks as a local zarr store.
- a format with a file per activation (``npy``) is not read from a bucket: pull the root
  (``hallulog pull``).

A store is recognised in a bucket by the storage registry's own rules (``detect_at`` on a
prefix); each format's bucket reader is an entry of :data:`BUCKET_READERS`.

The readers pickle without a client (each process makes its own), so they work in a PyTorch
``DataLoader`` with workers.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hallulog.remote.client import Bucket, ObjectStoreError
from hallulog.storage.errors import CorruptShardError, ManifestError, UnknownFormatError
from hallulog.storage.packed import PackedReader
from hallulog.storage.packed_layout import INDEX_ARRAYS, MANIFEST
from hallulog.storage.registry import detect_at, format_info
from hallulog.storage.zarr_store import ZarrReader

__all__ = [
    "BucketFiles",
    "BucketPackedReader",
    "BUCKET_READERS",
    "open_bucket_store",
    "detect_bucket_format",
]

_MANIFEST = "manifest.json"


class BucketFiles:
    """A range source (``hallulog.storage._ranged.RangeSource``) over objects of one bucket: file
    ``file_no`` is ``keys[file_no]``; one ranged GET per call, many calls in flight."""

    remote = True

    def __init__(self, bucket: Bucket, keys: Sequence[str]) -> None:
        self.bucket = bucket
        self.keys = list(keys)

    def read_into(self, file_no: int, offset: int, buffers: Sequence[memoryview]) -> None:
        want = sum(len(b) for b in buffers)
        if want == 0:
            return
        key = self.keys[file_no]
        data = memoryview(self.bucket.get_ranges(key, [offset], [want], coalesce=0)[0])
        if len(data) < want:
            raise CorruptShardError(
                f"truncated: wanted {want} bytes at offset {offset}, got {len(data)}",
                self.bucket.display(key),
            )
        pos = 0
        for b in buffers:
            n = len(b)
            b[:] = data[pos : pos + n]
            pos += n

    def close(self) -> None:
        """Nothing to release: the client's connections are pooled by obstore."""


def _cache_root() -> Path:
    base = os.environ.get("HALLULOG_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "hallulog"
    )
    return Path(base) / "object-store"


def _mirror(bucket: Bucket, names: Sequence[str], tag: str) -> Path:
    """Fetch ``names`` (small metadata objects) into a local cache directory named after the
    bucket URL and ``tag`` (the manifest's content hash), once; returns the directory."""
    digest = hashlib.sha256(f"{bucket.url}\n{tag}".encode()).hexdigest()[:24]
    out = _cache_root() / digest
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = out / name
        if path.exists():
            continue
        try:
            data = bucket.get_bytes(name)
        except FileNotFoundError:
            continue  # the reader names the missing file
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return out


class BucketPackedReader(PackedReader):
    """A finalized packed store in a bucket (``s3://bucket/prefix`` of its directory)."""

    def __init__(self, url: str | Bucket, verify_hash: bool = True):
        bucket = url if isinstance(url, Bucket) else Bucket(url)
        try:
            manifest = json.loads(bucket.get_bytes(MANIFEST))
        except FileNotFoundError:
            raise ManifestError("no manifest.json", bucket.display(MANIFEST)) from None
        except ValueError as exc:
            raise ManifestError(f"unparsable JSON ({exc})", bucket.display(MANIFEST)) from None
        try:
            arrays = [manifest["index_arrays"][n] for n in INDEX_ARRAYS]
            tag = str(manifest["content_hash"])
        except (KeyError, TypeError):
            raise ManifestError("not a packed manifest", bucket.display(MANIFEST)) from None
        self._bucket = bucket
        self._sizes = bucket.list()
        self._meta_dir = str(_mirror(bucket, [MANIFEST, *arrays], tag))
        super().__init__(self._meta_dir, verify_hash=verify_hash)
        self.path = bucket.url
        self._mpath = bucket.display(MANIFEST)
        self._shard_files = [bucket.display(s["file"]) for s in self.manifest["shards"]]

    def _load_index(self):
        meta_dir = self.__dict__.get("_meta_dir")
        if meta_dir is None or meta_dir == self.path:
            return super()._load_index()
        if not os.path.exists(os.path.join(meta_dir, MANIFEST)):  # another machine's cache
            names = [MANIFEST, *self.manifest["index_arrays"].values()]
            self._meta_dir = meta_dir = str(
                _mirror(self._bucket, names, self.manifest["content_hash"])
            )
        path, self.path = self.path, meta_dir
        try:
            return super()._load_index()
        finally:
            self.path = path

    def _check_sizes(self, ix) -> None:
        per_token = self.num_layers * self.hidden_size * self.dtype.itemsize
        for k, s in enumerate(self.manifest["shards"]):
            expect = int((ix["seq_len"][ix["shard_index"] == k] * per_token).sum())
            where = self._bucket.display(s["file"])
            if expect != s["size_bytes"]:
                raise ManifestError(
                    f"shard {s['file']} should hold {expect} bytes, manifest says "
                    f"{s['size_bytes']}",
                    self._bucket.display(MANIFEST),
                )
            size = self._sizes.get(s["file"])
            if size is None:
                raise CorruptShardError("shard object is missing", where)
            if size != s["size_bytes"]:
                raise CorruptShardError(
                    f"shard is {size} bytes, manifest says {s['size_bytes']} (truncated?)", where
                )

    def _range_source(self):
        source = self.__dict__.get("_source")
        if source is None:
            source = self._source = BucketFiles(
                self._bucket, [s["file"] for s in self.manifest["shards"]]
            )
        return source


def _child(bucket: Bucket, rel: str) -> Bucket:
    """The bucket URL of ``rel`` (relative, may hold ``..``) under ``bucket``'s prefix."""
    prefix = posixpath.normpath(posixpath.join(bucket.prefix or ".", rel))
    if prefix.startswith(".."):
        raise ManifestError(f"store path {rel!r} leaves the bucket", bucket.display(_MANIFEST))
    prefix = "" if prefix == "." else prefix
    child = Bucket(f"{bucket.scheme}://{bucket.bucket}/{prefix}", retry=bucket.retry)
    return child


def _manifest_format(bucket: Bucket) -> tuple[str | None, dict | None]:
    if bucket.head(_MANIFEST) is None:
        return None, None
    try:
        doc = json.loads(bucket.get_bytes(_MANIFEST))
        return doc.get("format"), doc
    except (ValueError, AttributeError) as exc:
        raise ManifestError(f"unparsable manifest ({exc})", bucket.display(_MANIFEST)) from None


@dataclass(frozen=True)
class _Prefix:
    """A prefix of a bucket as a place a store may be (``storage.registry.Location``)."""

    bucket: Bucket

    def exists(self, name: str) -> bool:
        return self.bucket.head(name) is not None

    def child(self, name: str) -> _Prefix:
        return _Prefix(_child(self.bucket, name))

    def manifest_format(self) -> str | None:
        return _manifest_format(self.bucket)[0]


def detect_bucket_format(url: str | Bucket) -> tuple[str, Bucket, dict | None]:
    """``(format, bucket of the store, its manifest)``: the URL of a store, of a worker
    directory or of ``consolidated/`` (as ``detect_format`` on disk)."""
    bucket = url if isinstance(url, Bucket) else Bucket(url)
    found = detect_at(_Prefix(bucket))
    if found is None:
        raise UnknownFormatError("no packed or zarr activation store here", bucket.url)
    fmt, where = found
    if format_info(fmt).file_per_activation or fmt not in BUCKET_READERS:
        raise UnknownFormatError(
            f"a {fmt} store (a file per activation) is not read from a bucket: "
            "`hallulog pull` the root and read it locally",
            bucket.url,
        )
    store = where.bucket  # type: ignore[attr-defined]
    return fmt, store, _manifest_format(store)[1]


def open_bucket_store(url: str | os.PathLike, **options):
    """``open_store`` for a URL: the store's reader, reading from the bucket."""
    fmt, bucket, doc = detect_bucket_format(os.fspath(url))
    return BUCKET_READERS[fmt](bucket, doc, **options)


def _open_multi(bucket: Bucket, doc: dict | None, **options):
    from hallulog.storage.multi import MultiReader, check_manifest

    check_manifest(bucket.url, doc)
    stores = [open_bucket_store(_child(bucket, s).url) for s in doc["stores"]]  # type: ignore[index]
    return MultiReader(bucket.url, doc, stores)


class BucketZarrReader(ZarrReader):
    """A zarr store in a bucket, through ``zarr.storage.ObjectStore`` over the obstore client,
    under the same checks as a local zarr store."""

    def __init__(self, bucket: Bucket):
        self._bucket = bucket
        super().__init__(bucket.url)

    def _zarr(self):
        z = self.__dict__.get("_z")
        if z is None or self.__dict__.get("_zpid") != os.getpid():
            import zarr
            from zarr.storage import ObjectStore

            try:
                z = zarr.open_consolidated(
                    ObjectStore(self._bucket.store, read_only=True), mode="r"
                )
            except ObjectStoreError:
                raise
            except Exception as exc:  # noqa: BLE001 - zarr raises many kinds
                raise ManifestError(
                    f"cannot open consolidated zarr store ({exc})", self.path
                ) from None
            self._z, self._zpid = z, os.getpid()
            self._arr = None
        return z


BUCKET_READERS: dict[str, Callable[..., object]] = {
    "packed": lambda bucket, doc, **options: BucketPackedReader(bucket, **options),
    "multi": _open_multi,
    "zarr": lambda bucket, doc, **options: BucketZarrReader(bucket),
}
"""The storage registry's formats read from a bucket, by name: ``(bucket, manifest,
**options)`` → the reader."""

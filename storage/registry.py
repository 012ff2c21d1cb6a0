"""The activation store formats, in one registry: their names (``FORMATS``, the ``StorageFormat``
type a config's field is annotated with), their writers (``open_writer``), their readers
(``open_store``), how each is recognised on disk or in a bucket (``detect_format``,
``detect_at``), and what the rest of hallulog needs to know of each (``format_info``: whether
each activation is a file of its own, the store's commit record, what a sample costs, which
files hold a committed sample). No module outside ``storage/`` branches on a format's name.

A format is one :class:`Format` entry of ``_REGISTRY``; ``multi`` (a manifest over several
stores, written by ``write_multi_manifest``) is read and detected like the others but has no
writer, so it is not one of ``FORMATS``.
"""

from __future__ import annotations

import importlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

from hallulog.contracts import layout
from hallulog.storage._commitlog import COMMIT_LOG
from hallulog.storage.base import ActivationReader, ActivationWriter
from hallulog.storage.errors import ManifestError, StoreNotFoundError, UnknownFormatError

__all__ = [
    "FORMATS",
    "StorageFormat",
    "Format",
    "Location",
    "format_info",
    "commit_records",
    "sample_bytes",
    "committed_files",
    "open_writer",
    "open_store",
    "detect_format",
    "detect_at",
    "store_dir",
    "write_multi_manifest",
]

StorageFormat = Literal["npy", "packed", "zarr"]
"""The formats a run can write (``RunConfig.storage_format``)."""
ACTIVATIONS_DIR = layout.ACTIVATIONS


def store_dir(root) -> str:
    """Where a writer opened on ``root`` (a worker directory) keeps its data."""
    return os.path.join(os.fspath(root), ACTIVATIONS_DIR)


class Location(Protocol):
    """A directory a store may be in: on disk (:class:`_Dir`), or a prefix of a bucket
    (``hallulog.remote.bucket_store``). Detection reads it through these three calls only."""

    def exists(self, name: str) -> bool: ...

    def child(self, name: str) -> Location: ...

    def manifest_format(self) -> str | None:
        """The ``format`` of its ``manifest.json``; None without one."""


@dataclass(frozen=True)
class _Dir:
    path: str

    def exists(self, name: str) -> bool:
        return os.path.exists(os.path.join(self.path, name))

    def child(self, name: str) -> _Dir:
        return _Dir(os.path.join(self.path, name))

    def manifest_format(self) -> str | None:
        return _manifest_format(self.path)


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


@dataclass(frozen=True)
class Format:
    """One store format.

    ``writer``/``reader``: ``"module:Class"`` in this package, imported on first use (zarr and
    its codecs load only for zarr stores). ``detect(cand, manifest_format)``: the store's
    location when ``cand`` (the location given, then its ``activations/``) holds this format,
    else None; ``manifest_format`` is the ``format`` of ``cand/manifest.json`` (None without
    one). ``fallback``: detected only on the location given, after every other format had its
    try on both candidates (npy: its ``activation_index.jsonl`` sits beside other formats'
    stores). ``reader_options``: whether ``open_store``'s options go to the reader.
    """

    name: str
    detect: Callable[[Location, str | None], Location | None]
    reader: str
    writer: str | None = None
    fallback: bool = False
    reader_options: bool = False
    file_per_activation: bool = False
    """Each activation is a file of its own, named by its activation index line's
    ``file_path`` (npy): consolidation hard-links the files, validation checks each, a key
    can be written again (``retry`` redoes a committed prompt's missing activations). Else the
    samples live in append-only stores (packed, zarr): consolidation writes a manifest over
    the worker stores (or merges them), and a committed key is never written again."""
    commit_record: str | None = None
    """The store's commit record, relative to its directory: appended per committed sample,
    shipped with the samples it commits (packed, zarr: the commit log)."""
    sample_bytes: str | None = None
    """``"module:function"``: the bytes one stored sample costs (``estimate``'s projection;
    keyword arguments ``layers``, ``rows``, ``hidden_size``, ``itemsize``, ``key_len``)."""
    sample_files: str | None = None
    """``"module:function"``: for a store whose samples are files of an array (zarr), the files
    holding given committed samples and the metadata files (``committed_files``)."""

    def writer_class(self) -> type[ActivationWriter]:
        return _load(self.writer)  # type: ignore[arg-type]

    def reader_class(self) -> type[ActivationReader]:
        return _load(self.reader)


def _load(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(f".{module}", __package__), name)


def _packed(cand: Location, manifest_format: str | None) -> Location | None:
    if manifest_format == "hallulog.packed":
        return cand
    if (
        manifest_format != "hallulog.multi"
        and cand.exists(COMMIT_LOG)
        and cand.exists("shard_000000.bin")
    ):
        return cand  # unfinalized: the reader says how to recover
    return None


def _multi(cand: Location, manifest_format: str | None) -> Location | None:
    return cand if manifest_format == "hallulog.multi" else None


def _zarr(cand: Location, manifest_format: str | None) -> Location | None:  # noqa: ARG001
    for z in (cand, cand.child("activations.zarr")):
        if z.exists(".zgroup") or z.exists("zarr.json"):
            return z
    return None


def _npy(cand: Location, manifest_format: str | None) -> Location | None:  # noqa: ARG001
    return cand if cand.exists(layout.ACTIVATION_INDEX) else None


_REGISTRY: dict[str, Format] = {
    f.name: f
    for f in (  # detection order
        Format(
            "packed",
            _packed,
            reader="packed:PackedReader",
            writer="packed:PackedWriter",
            reader_options=True,
            commit_record=COMMIT_LOG,
            sample_bytes="packed_layout:sample_bytes",
        ),
        Format("multi", _multi, reader="multi:MultiReader"),
        Format(
            "zarr",
            _zarr,
            reader="zarr_store:ZarrReader",
            writer="zarr_store:ZarrWriter",
            commit_record=COMMIT_LOG,
            sample_bytes="zarr_store:sample_bytes",
            sample_files="zarr_store:sample_files",
        ),
        Format(
            "npy",
            _npy,
            reader="npy:NpyReader",
            writer="npy:NpyWriter",
            fallback=True,
            file_per_activation=True,
            sample_bytes="npy:sample_bytes",
        ),
    )
}

FORMATS: tuple[str, ...] = tuple(sorted(f.name for f in _REGISTRY.values() if f.writer))
"""The writable formats (``StorageFormat``'s values)."""
if set(FORMATS) != set(get_args(StorageFormat)):  # one list: the registry is the type's source
    raise RuntimeError(
        f"hallulog.storage.registry: StorageFormat {get_args(StorageFormat)} != the "
        f"registry's writable formats {FORMATS}"
    )


def format_info(fmt: str) -> Format:
    """The registry's entry of format ``fmt`` (a run manifest's ``storage_format``);
    :class:`UnknownFormatError` naming the choices when there is none."""
    entry = _REGISTRY.get(fmt)
    if entry is None:
        raise UnknownFormatError(f"unknown storage format {fmt!r}; choose one of {FORMATS}")
    return entry


def commit_records() -> tuple[str, ...]:
    """The commit records of every format with one (relative to a store's directory), each
    name once."""
    return tuple(dict.fromkeys(f.commit_record for f in _REGISTRY.values() if f.commit_record))


def sample_bytes(
    fmt: str, *, layers: int, rows: float, hidden_size: int, itemsize: int, key_len: int = 18
) -> float:
    """Bytes one stored sample of ``layers`` x ``rows`` x ``hidden_size`` costs in ``fmt``: its
    data and the format's per-sample overhead (a projection: nothing is read)."""
    entry = format_info(fmt)
    if entry.sample_bytes is None:
        raise UnknownFormatError(f"storage format {fmt!r} is not written by a run")
    return _load(entry.sample_bytes)(
        layers=layers, rows=rows, hidden_size=hidden_size, itemsize=itemsize, key_len=key_len
    )


def committed_files(root, samples) -> tuple[list[str], list[str]]:
    """For a writer's store on ``root`` (a worker directory) whose samples are files of an
    array: the files holding the committed ``samples`` (their index in the array), written
    once, and its metadata files, rewritten in place; ``([], [])`` for the other formats."""
    where = store_dir(root)
    for entry in _REGISTRY.values():
        if entry.sample_files and entry.detect(_Dir(where), None) is not None:
            return _load(entry.sample_files)(where, samples)
    return [], []


def open_writer(
    fmt: str, root, layer_ids, hidden_size: int, dtype="float16", **options
) -> ActivationWriter:
    """Open (or reopen, recovering after a crash) the ``fmt`` writer of ``root/activations/``.

    ``dtype``: ``float16``, ``float32`` or ``bfloat16`` (``hallulog.storage.dtypes``), by name or dtype.

    ``options``: packed ``shard_bytes``; zarr ``t_chunk``, ``zarr_format`` (2 or 3),
    ``sharded`` (zarr v3 sharding codec), ``model_id``.
    """
    entry = _REGISTRY.get(fmt)
    if entry is None or entry.writer is None:
        raise UnknownFormatError(f"unknown storage format {fmt!r}; choose one of {FORMATS}")
    cls = entry.writer_class()
    return cls(
        store_dir(root), layer_ids=layer_ids, hidden_size=hidden_size, dtype=dtype, **options
    )


def detect_at(location: Location) -> tuple[str, Location] | None:
    """``(format, the store's location)`` for a store, a worker directory or a consolidated
    directory at ``location`` (on disk or in a bucket); None when none is there."""
    for cand in (location, location.child(ACTIVATIONS_DIR)):
        manifest_format = cand.manifest_format()
        for entry in _REGISTRY.values():
            if not entry.fallback and (where := entry.detect(cand, manifest_format)) is not None:
                return entry.name, where
    for entry in _REGISTRY.values():
        if entry.fallback and (where := entry.detect(location, None)) is not None:
            return entry.name, where
    return None


def detect_format(path) -> tuple[str, str]:
    """``(format, store path)`` for a store, a worker directory or a consolidated directory."""
    path = os.fspath(path)
    found = detect_at(_Dir(path))
    if found is not None:
        return found[0], found[1].path  # type: ignore[attr-defined]
    if not os.path.exists(path):
        raise StoreNotFoundError("no such file or directory", path)
    raise UnknownFormatError("no packed, zarr or npy activation store here", path)


#: URL schemes of stores in object storage → their opener, ``"module:function"``, imported on
#: first use (as fsspec's registry of known implementations): storage reads local files and
#: knows no client; ``hallulog.remote`` brings the bucket reader.
URL_OPENERS: dict[str, str] = {"s3": "hallulog.remote.bucket_store:open_bucket_store"}
_URL_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/")


def _url_opener(path) -> Callable[..., ActivationReader] | None:
    """The opener of ``path`` when it is a URL (``s3://b/p``, or ``s3:/b/p`` as a ``Path``
    leaves it), None for a local path; a URL of an unknown scheme is refused."""
    m = _URL_SCHEME.match(os.fspath(path))
    if m is None:
        return None
    scheme = m.group(1).lower()
    if scheme not in URL_OPENERS:
        raise UnknownFormatError(
            f"no store reader for {scheme}:// URLs (supported: {', '.join(URL_OPENERS)})",
            os.fspath(path),
        )
    module, _, name = URL_OPENERS[scheme].partition(":")
    return getattr(importlib.import_module(module), name)


def open_store(path, **options) -> ActivationReader:
    """Open any store read-only; see ``detect_format`` for what ``path`` may point at.
    A URL (``s3://bucket/prefix``) reads from the bucket (:data:`URL_OPENERS`)."""
    if (opener := _url_opener(path)) is not None:
        return opener(path, **options)
    fmt, where = detect_format(path)
    if fmt == "multi":  # a manifest over stores, each opened as any store
        from hallulog.storage.multi import MultiReader, check_manifest

        with open(os.path.join(where, "manifest.json")) as f:
            manifest = json.load(f)
        check_manifest(where, manifest)
        return MultiReader(
            where, manifest, [open_store(os.path.join(where, s)) for s in manifest["stores"]]
        )
    entry = _REGISTRY[fmt]
    return entry.reader_class()(where, **(options if entry.reader_options else {}))


def write_multi_manifest(out_dir, store_dirs, check_unique_keys: bool = True) -> dict:
    """Write ``out_dir/manifest.json`` listing ``store_dirs`` (seed 000 Option A); returns it.

    Paths are stored relative to ``out_dir``; see ``multi.build_manifest`` for the checks.
    """
    from hallulog.storage.multi import build_manifest, write_manifest

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

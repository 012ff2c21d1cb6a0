"""Copy a directory tree to a bucket and back, exactly once, resumable after a kill.

Upload: every file becomes one object, written with a create-only PUT (``If-None-Match: *``)
carrying its CRC-32C as user metadata. A key that exists already (an earlier, killed upload; a
retried PUT whose first try landed) is kept when its size and checksum are the file's, and
refused otherwise: nothing is ever overwritten, so a versioned bucket holds one version of each
key. The tree's list of files (path, size, CRC-32C) is written last, create-only, as
``.hallulog-tree.json``: its presence says the upload is complete.

Download: the list is read first (absent: the upload is unfinished); each file is streamed to
``NAME.partial``, checked against the list's size and checksum, fsynced and renamed. Files already
there with the right size and checksum are skipped, so a killed download resumes; a file there
with other bytes is refused.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from hallulog.remote.client import (
    CHECKSUM_ATTRIBUTE,
    Bucket,
    ObjectExistsError,
    ObjectStoreError,
    crc32c_hex,
)
from hallulog.storage._io import fsync_dir

__all__ = [
    "TREE_LIST",
    "FileEntry",
    "SyncSummary",
    "scan_tree",
    "upload_tree",
    "download_tree",
    "read_tree_list",
    "file_crc32c",
]

log = logging.getLogger(__name__)

TREE_LIST = ".hallulog-tree.json"
TREE_FORMAT = "hallulog.tree"
SINGLE_PUT_LIMIT = 5 * (1 << 30)
"""S3's limit of one PUT; a create-only write is one PUT, so no file may be larger."""


@dataclass(frozen=True)
class FileEntry:
    path: str
    """Relative path, ``/``-separated (the object key under the prefix)."""
    size: int
    crc32c: str
    """8 hex digits."""


@dataclass
class SyncSummary:
    files: int = 0
    transferred: int = 0
    """Files copied by this call."""
    skipped: int = 0
    """Files already there, identical (an earlier, interrupted call copied them)."""
    bytes_transferred: int = 0
    seconds: float = 0.0
    already_complete: bool = False
    extra: dict = field(default_factory=dict)


def file_crc32c(path: str, chunk: int = 8 << 20) -> int:
    import google_crc32c

    crc = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            data = f.read(chunk)
            if not data:
                return crc
            crc = google_crc32c.extend(crc, data)


def scan_tree(
    root: str | os.PathLike, exclude: Callable[[str], bool] = lambda rel: False
) -> list[FileEntry]:
    """Every regular file under ``root`` not excluded (``exclude(rel_path)``), with its size and
    CRC-32C, sorted by path. A symbolic link is refused (its target may lie outside the tree)."""
    root = os.fspath(root)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
        dirnames[:] = sorted(d for d in dirnames if not exclude(rel_dir + d + "/"))
        for name in filenames:
            rel = rel_dir + name
            full = os.path.join(dirpath, name)
            if exclude(rel) or rel == TREE_LIST:
                continue
            if os.path.islink(full) or not os.path.isfile(full):
                raise ObjectStoreError(
                    f"{full}: not a regular file (a link or a device); copy "
                    "the tree without links first"
                )
            size = os.path.getsize(full)
            if size > SINGLE_PUT_LIMIT:
                raise ObjectStoreError(
                    f"{full}: {size} bytes is over the 5 GiB of one "
                    "create-only PUT (write smaller shards)"
                )
            out.append(FileEntry(rel, size, crc32c_hex(file_crc32c(full))))
    return sorted(out, key=lambda e: e.path)


def _tree_doc(entries: Iterable[FileEntry], extra: dict) -> bytes:
    doc = {
        "format": TREE_FORMAT,
        "schema_version": 1,
        **extra,
        "files": [{"path": e.path, "size": e.size, "crc32c": e.crc32c} for e in entries],
    }
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def read_tree_list(bucket: Bucket) -> dict | None:
    """The bucket prefix's ``.hallulog-tree.json`` (None when absent), checked."""
    if bucket.head(TREE_LIST) is None:
        return None
    where = bucket.display(TREE_LIST)
    try:
        doc = json.loads(bucket.get_bytes(TREE_LIST))
        if doc.get("format") != TREE_FORMAT:
            raise ValueError(f"format is {doc.get('format')!r}, not {TREE_FORMAT!r}")
        doc["entries"] = [
            FileEntry(str(f["path"]), int(f["size"]), str(f["crc32c"])) for f in doc["files"]
        ]
    except (ValueError, KeyError, TypeError) as exc:
        raise ObjectStoreError(f"{where}: unreadable file list ({exc})") from None
    for e in doc["entries"]:
        if e.path.startswith("/") or ".." in e.path.split("/"):
            raise ObjectStoreError(f"{where}: path {e.path!r} leaves the tree")
    return doc


def _same_object(bucket: Bucket, entry: FileEntry, size: int | None) -> bool:
    """Whether the object at ``entry.path`` holds the entry's bytes (size, then checksum)."""
    if size is None:
        head = bucket.head(entry.path)
        if head is None:
            return False
        size = int(head["size"])
    if size != entry.size:
        raise ObjectExistsError(
            f"{bucket.display(entry.path)} exists with {size} bytes, the "
            f"local file has {entry.size}; refusing to overwrite it"
        )
    got = bucket.attributes(entry.path, size).get(CHECKSUM_ATTRIBUTE)
    if got != entry.crc32c:
        raise ObjectExistsError(
            f"{bucket.display(entry.path)} exists with other bytes (CRC-32C "
            f"{got or 'not recorded'}, the local file's is {entry.crc32c}); "
            "refusing to overwrite it"
        )
    return True


def _upload_one(bucket: Bucket, root: str, entry: FileEntry) -> bool:
    """Create the object of one file; True when this call wrote it."""
    attrs = {CHECKSUM_ATTRIBUTE: entry.crc32c}
    full = os.path.join(root, *entry.path.split("/"))
    if entry.size == 0:
        created = bucket.put_create(entry.path, b"", attrs)
    else:
        with open(full, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            if len(m) != entry.size:
                raise ObjectStoreError(
                    f"{full}: changed while uploading ({len(m)} bytes, {entry.size} when scanned)"
                )
            view = memoryview(m)
            try:
                created = bucket.put_create(entry.path, view, attrs)
            finally:
                view.release()
    if not created:  # a retry whose first try landed, or another uploader: compare
        _same_object(bucket, entry, None)
    return created


def upload_tree(
    root: str | os.PathLike,
    bucket: Bucket,
    entries: list[FileEntry],
    extra: dict | None = None,
    concurrency: int = 8,
    guard: Callable[[], None] | None = None,
) -> SyncSummary:
    """Upload ``entries`` of ``root`` (from :func:`scan_tree`) to ``bucket``, then the file list.

    Exactly once and resumable: see the module docstring. ``extra`` goes into the file list.
    ``guard`` is called before the uploads and before the file list, the commit point: it
    raises to stop the upload (the writer's lease of the prefix was lost).
    """
    root = os.fspath(root)
    t0 = time.monotonic()
    summary = SyncSummary(files=len(entries))
    doc = _tree_doc(entries, extra or {})
    existing = read_tree_list(bucket)
    if existing is not None:
        if existing["entries"] != entries:
            raise ObjectExistsError(
                f"{bucket.url} already holds a complete upload of another "
                f"tree ({len(existing['entries'])} files); choose another "
                "prefix"
            )
        summary.skipped = len(entries)
        summary.already_complete = True
        summary.seconds = time.monotonic() - t0
        return summary
    if guard is not None:
        guard()
    present = bucket.list()
    todo = []
    for e in entries:
        if e.path in present and _same_object(bucket, e, present[e.path]):
            summary.skipped += 1
        else:
            todo.append(e)
    log.info("%s: %d files to upload, %d already there", bucket.url, len(todo), summary.skipped)
    # largest first: the long PUTs start early and the small ones fill in behind them
    todo.sort(key=lambda e: -e.size)
    with ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="upload") as pool:
        futures = [(e, pool.submit(_upload_one, bucket, root, e)) for e in todo]
        for e, fut in futures:
            if fut.result():
                summary.transferred += 1
                summary.bytes_transferred += e.size
            else:
                summary.skipped += 1
    if guard is not None:
        guard()
    if not bucket.put_create(TREE_LIST, doc, {"Content-Type": "application/json"}):
        existing = read_tree_list(bucket)
        if existing is None or existing["entries"] != entries:
            raise ObjectExistsError(
                f"{bucket.display(TREE_LIST)} was written meanwhile by "
                "another upload of a different tree"
            )
    summary.seconds = time.monotonic() - t0
    return summary


def _local_matches(path: str, entry: FileEntry, replace: bool = False) -> bool:
    """Whether a local file already holds the entry's bytes; ObjectExistsError if other bytes
    (False with ``replace``: it is downloaded over)."""
    if not os.path.exists(path):
        return False
    if os.path.getsize(path) == entry.size and crc32c_hex(file_crc32c(path)) == entry.crc32c:
        return True
    if replace:
        return False
    raise ObjectExistsError(
        f"{path} exists with other bytes than {entry.path} in the bucket; "
        "refusing to overwrite it (pull into an empty directory)"
    )


def _download_one(bucket: Bucket, dest: str, entry: FileEntry) -> None:
    path = os.path.join(dest, *entry.path.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = path + ".partial"
    with open(partial, "wb") as f:
        size, crc = bucket.download(entry.path, f)
        f.flush()
        os.fsync(f.fileno())
    if size != entry.size or crc32c_hex(crc) != entry.crc32c:
        os.unlink(partial)
        raise ObjectStoreError(
            f"{bucket.display(entry.path)}: read {size} bytes with CRC-32C "
            f"{crc32c_hex(crc)}, the file list says {entry.size} bytes, "
            f"{entry.crc32c}"
        )
    os.replace(partial, path)
    fsync_dir(os.path.dirname(path))


def download_tree(
    bucket: Bucket, dest: str | os.PathLike, concurrency: int = 8, replace: bool = False
) -> SyncSummary:
    """Download the complete upload at ``bucket`` into ``dest`` (see the module docstring).
    ``replace``: a local file with other bytes is replaced instead of refused (a directory the
    caller owns, whose truth is the bucket)."""
    dest = os.fspath(dest)
    t0 = time.monotonic()
    doc = read_tree_list(bucket)
    if doc is None:
        raise ObjectStoreError(
            f"{bucket.display(TREE_LIST)} is missing: nothing complete was "
            "uploaded there (an interrupted push: rerun it)"
        )
    entries: list[FileEntry] = doc["entries"]
    summary = SyncSummary(
        files=len(entries), extra={k: v for k, v in doc.items() if k not in ("files", "entries")}
    )
    os.makedirs(dest, exist_ok=True)
    todo = []
    for e in entries:
        if _local_matches(os.path.join(dest, *e.path.split("/")), e, replace):
            summary.skipped += 1
        else:
            todo.append(e)
    todo.sort(key=lambda e: -e.size)
    with ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="download") as pool:
        for e, fut in [(e, pool.submit(_download_one, bucket, dest, e)) for e in todo]:
            fut.result()
            summary.transferred += 1
            summary.bytes_transferred += e.size
    summary.seconds = time.monotonic() - t0
    return summary

"""Small POSIX helpers shared by the formats: durable writes, atomic renames, full preads."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import inspect
import json
import os
import sys
import tokenize

import numpy as np
from hallulog.storage.errors import CorruptShardError, ManifestError, StorageError

#: What parsers of damaged bytes raise (np.load, json, zarr, tarfile, ast, dict/list access on
#: metadata of the wrong shape) besides the project's own errors.
MALFORMED = (
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    EOFError,
    SyntaxError,
    OverflowError,
    AttributeError,
    tokenize.TokenError,
    RecursionError,
)


def malformed_is_manifest_error(fn):
    """Turn what a parser of damaged input raises into a :class:`ManifestError` naming the path
    (``self.path`` of a reader method, else the function's first argument); works on generator
    functions too. Readers' own ``StorageError``s pass through unchanged."""

    def where(args) -> str:
        for a in args[:2]:
            p = getattr(a, "path", a)
            if isinstance(p, (str, os.PathLike)):
                return os.fspath(p)
        return "?"

    def convert(exc: BaseException, args) -> ManifestError:
        return ManifestError(f"malformed or truncated ({type(exc).__name__}: {exc})", where(args))

    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def gen(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except StorageError:
                raise
            except MALFORMED as exc:
                raise convert(exc, args) from None

        return gen

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except StorageError:
            raise
        except MALFORMED as exc:
            raise convert(exc, args) from None

    return wrapper


def fsync_dir(path: str) -> None:
    """fsync a directory so that renames and creations inside it are durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` via ``path.tmp`` + fsync + rename + fsync(dir)."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def atomic_write_json(path: str, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def atomic_save_npy(path: str, arr: np.ndarray) -> None:
    """``np.save`` to ``path.tmp``, fsync, rename (seed 004 §1.1)."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        np.save(f, arr, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _bytes_view(buf) -> memoryview:
    """A flat byte view of a C-contiguous array or bytes-like object (empty arrays included)."""
    if isinstance(buf, np.ndarray):
        return memoryview(buf.reshape(-1).view(np.uint8))
    return memoryview(buf).cast("B")


def write_all(fd: int, buf) -> int:
    """os.write until every byte of ``buf`` is written; returns the byte count."""
    mv = _bytes_view(buf)
    n = 0
    while n < len(mv):
        n += os.write(fd, mv[n:])
    return n


def _sync_file_range():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Start writing ``nbytes`` at ``offset`` of ``fd`` to the disk; do not wait for it.

    Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``: the disk works on a group's bytes while
    the next samples are cast and written, so the group's one ``fdatasync`` waits for the tail
    only. It makes nothing durable (no metadata, no device cache flush): the ``fdatasync`` stays
    the commit. Elsewhere, or where the file system refuses it, nothing happens.
    """
    if _SYNC_FILE_RANGE is not None and nbytes > 0:
        _SYNC_FILE_RANGE(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)  # errors: fdatasync reports


def pread_into(fd: int, out: np.ndarray, offset: int, path: str) -> None:
    """Fill ``out`` (C-contiguous) from ``fd`` at ``offset``; a short read is a truncated file.

    ``os.preadv`` releases the GIL, so several of these run in parallel on a thread pool.
    """
    mv = _bytes_view(out)
    done = 0
    while done < len(mv):
        n = os.preadv(fd, [mv[done:]], offset + done)
        if n == 0:
            raise CorruptShardError(
                f"truncated: wanted {len(mv)} bytes at offset {offset}, file ends after {done}",
                path,
            )
        done += n


def fsync_tree(top: str) -> None:
    """fdatasync every file under ``top``, then fsync its directories, deepest first."""
    dirs = []
    for dirpath, _dirnames, filenames in os.walk(top):
        dirs.append(dirpath)
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
    for d in reversed(dirs):
        fsync_dir(d)


def fsync_file(path: str) -> None:
    """fsync ``path`` when it exists."""
    if os.path.exists(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_tree_meta(store_path: str) -> None:
    """Zarr: fsync every file of the store but the chunks (already durable), then its directories."""
    dirs = []
    for dirpath, dirnames, filenames in os.walk(store_path):
        if os.path.basename(dirpath) == "activations" and os.path.dirname(dirpath).endswith(
            "arrays"
        ):
            dirnames[:] = []  # chunk directories: synced at commit
        dirs.append(dirpath)
        for name in filenames:
            fsync_file(os.path.join(dirpath, name))
    for d in reversed(dirs):
        fsync_dir(d)

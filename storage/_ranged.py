"""Coalesced, concurrent ranged reads: how an :class:`~hallulog.storage.base.ExtentReader` fetches a batch.

Two parts:

- a **range source**: numbered files read by byte range, ``read_into(file_no, offset, buffers)``
  filling ``buffers`` in order from consecutive bytes. :class:`LocalFiles` does it with one
  ``os.preadv`` (a scatter read: every buffer filled by the kernel, no copy of ours) on lazily
  opened descriptors; an object store plugs in with a ``Range`` GET per call (the same three
  methods: ``read_into``, ``close``, ``remote``).
- a **plan**: the batch's extents sorted by (file, offset), neighbours closer than ``gap`` bytes
  merged into one range (the bytes between them land in a scratch buffer and are dropped), each
  range at most ``max_range`` bytes and ``_MAX_IOV`` pieces; the ranges are then read by a pool
  of ``concurrency`` threads, so their latencies overlap.

Where latency is what costs (NFS, Lustre, a FUSE mount, an object store: :func:`is_remote`), the
plan reads with many threads in flight and merges across small gaps; on a local disk it keeps to
a few threads, merges only touching extents, and a small batch is read on the calling thread.
``HALLULOG_READ_CONCURRENCY`` and ``HALLULOG_READ_GAP_BYTES`` override the two for any store.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from hallulog.storage.errors import CorruptShardError

__all__ = [
    "RangeSource",
    "LocalFiles",
    "ReadPolicy",
    "plan_ranges",
    "read_extents",
    "is_remote",
    "policy_for",
]

#: file system types whose every operation is a round trip (mount type, or its prefix before ".")
REMOTE_FS = frozenset(
    {
        "nfs",
        "nfs4",
        "lustre",
        "fuse",
        "fuseblk",
        "cifs",
        "smb3",
        "smbfs",
        "9p",
        "ceph",
        "glusterfs",
        "gpfs",
        "beegfs",
        "wekafs",
        "pvfs2",
        "orangefs",
        "afs",
        "s3fs",
        "gcsfuse",
    }
)
_MAX_IOV = 512  # well under IOV_MAX (1024) per preadv


class RangeSource(Protocol):
    """Numbered files read by byte range: the one thing a coalescing read needs."""

    remote: bool
    """Every call is a round trip (network storage): read with many calls in flight."""

    def read_into(self, file_no: int, offset: int, buffers: Sequence[memoryview]) -> None:
        """Fill ``buffers`` in order from the consecutive bytes of file ``file_no`` starting at
        ``offset``; fewer bytes than asked is a :class:`~hallulog.storage.errors.CorruptShardError`."""

    def close(self) -> None:
        """Release what the source holds (it reopens lazily)."""


class LocalFiles:
    """A :class:`RangeSource` over files named by ``path_of(file_no)``: POSIX ``preadv``.

    Descriptors open lazily and are reopened after a fork; ``per_read`` opens and closes the
    file around every call instead (formats with a file per sample). (No ``POSIX_FADV_RANDOM``
    on remote files: on a FUSE mount it turns one 128 KiB request into many 4 KiB ones.)
    """

    def __init__(
        self, path_of: Callable[[int], str], *, per_read: bool = False, remote: bool = False
    ) -> None:
        self.path_of = path_of
        self.per_read = per_read
        self.remote = remote
        self._fds: dict[int, int] = {}
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def fd(self, file_no: int) -> int:
        if self._pid != os.getpid():
            self._fds, self._pid, self._lock = {}, os.getpid(), threading.Lock()
        fd = self._fds.get(file_no)
        if fd is None:
            with self._lock:
                fd = self._fds.get(file_no)
                if fd is None:
                    fd = self._fds[file_no] = self._open(file_no)
        return fd

    def _open(self, file_no: int) -> int:
        path = self.path_of(file_no)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise CorruptShardError("data file is missing", path) from None
        return fd

    def read_into(self, file_no: int, offset: int, buffers: Sequence[memoryview]) -> None:
        if not self.per_read:
            _preadv_all(self.fd(file_no), buffers, offset, self.path_of(file_no))
            return
        fd = self._open(file_no)
        try:
            _preadv_all(fd, buffers, offset, self.path_of(file_no))
        finally:
            os.close(fd)

    def close(self) -> None:
        if self._pid == os.getpid():
            for fd in self._fds.values():
                os.close(fd)
        self._fds = {}


def _preadv_all(fd: int, buffers: Sequence[memoryview], offset: int, path: str) -> None:
    """``os.preadv`` until every buffer is full (a short read resumes where it stopped)."""
    bufs = [b for b in buffers if len(b)]  # an empty extent (no tokens) reads nothing
    want = sum(len(b) for b in bufs)
    done = 0
    while bufs:
        n = os.preadv(fd, bufs, offset + done)
        if n == 0:
            raise CorruptShardError(
                f"truncated: wanted {want} bytes at offset {offset}, file ends after {done}", path
            )
        done += n
        while bufs and n >= len(bufs[0]):  # drop the buffers filled, cut into a partial one
            n -= len(bufs[0])
            bufs.pop(0)
        if n:
            bufs[0] = bufs[0][n:]


@dataclass(frozen=True)
class ReadPolicy:
    """How a batch is read: threads in flight, the largest gap merged, when to stay inline."""

    concurrency: int
    gap: int
    """Extents of one file at most this many bytes apart are read as one range."""
    inline_below: int
    """A batch of fewer bytes than this is read on the calling thread (local files: handing
    small reads to threads costs more than it saves)."""
    max_range: int = 32 << 20


def is_remote(path: str) -> bool:
    """True when ``path`` lies on a network or FUSE file system (``/proc/mounts``)."""
    try:
        real = os.path.realpath(path)
        best, fstype = "", ""
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(
                    best
                ):
                    best, fstype = mnt, parts[2]
    except OSError:
        return False
    return fstype in REMOTE_FS or fstype.split(".")[0] in REMOTE_FS


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"${name}: expected an integer, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"${name}: must be >= 0, got {value}")
    return value


def policy_for(remote: bool) -> ReadPolicy:
    """The defaults for a local or a remote store, with the environment's overrides."""
    if remote:
        policy = ReadPolicy(concurrency=32, gap=256 << 10, inline_below=0)
    else:
        policy = ReadPolicy(concurrency=min(8, os.cpu_count() or 1), gap=0, inline_below=4 << 20)
    conc, gap = _env_int("HALLULOG_READ_CONCURRENCY"), _env_int("HALLULOG_READ_GAP_BYTES")
    return ReadPolicy(
        concurrency=max(1, conc) if conc is not None else policy.concurrency,
        gap=gap if gap is not None else policy.gap,
        inline_below=policy.inline_below,
        max_range=policy.max_range,
    )


def plan_ranges(
    jobs: Sequence[tuple[int, int, int]], sizes: Sequence[int], gap: int, max_range: int
) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """Merge ``jobs`` ``(file_no, offset, k)`` (extent ``k`` has ``sizes[k]`` bytes) into ranges.

    Returns ``(file_no, offset, pieces)`` per range, in (file, offset) order; a piece is
    ``(k, 0)`` for extent ``k`` or ``(-1, n)`` for ``n`` bytes to skip. Overlapping extents
    (the same extent asked twice) each get their own range.
    """
    out: list[tuple[int, int, list[tuple[int, int]]]] = []
    cur_file, start, end, pieces = -1, 0, 0, None
    for file_no, off, k in sorted(jobs):
        n = int(sizes[k])
        if (
            pieces is not None
            and file_no == cur_file
            and end <= off <= end + gap
            and off + n - start <= max_range
            and len(pieces) < _MAX_IOV - 1
        ):
            if off > end:
                pieces.append((-1, off - end))
            pieces.append((k, 0))
            end = off + n
            continue
        if pieces is not None:
            out.append((cur_file, start, pieces))
        cur_file, start, end, pieces = file_no, off, off + n, [(k, 0)]
    if pieces is not None:
        out.append((cur_file, start, pieces))
    return out


_scratch = threading.local()


def _gap_buffer(n: int) -> memoryview:
    """A per-thread scratch of at least ``n`` bytes: gaps of a range are read into it, dropped."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or len(buf) < n:
        buf = _scratch.buf = np.empty(max(n, 64 << 10), np.uint8)
    return memoryview(buf)[:n]


def _byte_view(a: np.ndarray) -> memoryview:
    return memoryview(a.reshape(-1).view(np.uint8))


def _read_range(source: RangeSource, rng, views: Sequence[memoryview]) -> None:
    file_no, offset, pieces = rng
    bufs = [views[k] if k >= 0 else _gap_buffer(n) for k, n in pieces]
    source.read_into(file_no, offset, bufs)


def read_extents(
    source: RangeSource,
    jobs: Sequence[tuple[int, int, int]],
    outs: Sequence[np.ndarray],
    policy: ReadPolicy,
    pool: Callable[[], ThreadPoolExecutor],
) -> None:
    """Fill ``outs[k]`` (C-contiguous) from file ``file_no`` at ``offset`` for every job
    ``(file_no, offset, k)``: merged into ranges (:func:`plan_ranges`), read by ``pool()``'s
    threads when more than one range is worth it, else on this thread."""
    views = [_byte_view(o) for o in outs]
    sizes = [len(v) for v in views]
    ranges = plan_ranges(jobs, sizes, policy.gap, policy.max_range)
    total = sum(sizes)
    if len(ranges) <= 1 or policy.concurrency <= 1 or total < policy.inline_below:
        for rng in ranges:
            _read_range(source, rng, views)
        return
    nthreads = min(policy.concurrency, len(ranges))
    if source.remote:  # one range per task: as many round trips in flight as threads
        futs = [pool().submit(_read_range, source, rng, views) for rng in ranges]
    else:  # local: contiguous runs of ranges, one per thread, each reading forward
        step = -(-len(ranges) // nthreads)
        futs = [
            pool().submit(_read_ranges, source, ranges[i : i + step], views)
            for i in range(0, len(ranges), step)
        ]
    errors = []
    for f in futs:
        try:
            f.result()
        except BaseException as exc:  # every read ends before the caller's buffers are reused
            errors.append(exc)
    if errors:
        raise errors[0]


def _read_ranges(source: RangeSource, ranges, views) -> None:
    for rng in ranges:
        _read_range(source, rng, views)

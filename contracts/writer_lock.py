"""One writer per worker directory: ``worker_{i}/writer.lock``.

The process that appends to a worker directory (a worker process, a Ray actor's worker) holds an
exclusive ``flock`` on this file for as long as it writes (:func:`hold_writer`), with its pid,
host and process start time written into it. Whoever rolls the directory back to its last commit
before a new writer starts fences it first (:func:`fence_writer`): it takes the same lock, so no
earlier writer can append after the rollback has read the directory.

Why a fence and not only the root lock: the root lock (``contracts/root_lock.py``) says which
*orchestrator* owns the root, but a worker of a killed orchestrator can outlive it — e.g. one
that was still starting up when the orchestrator died, before it asked for its parent-death
signal — and would commit the groups already in its pipe after the next session has read the
directory and handed the same groups to another worker: one prompt committed twice. With the
fence, such a leftover holder on this host is killed (it belongs to no live run: the caller
holds the root) and the lock is taken once the kernel has released it; a holder on another host
(a Ray actor of an earlier driver, or of a lost node) is waited for, up to
:func:`fence_seconds`.

On file systems without ``flock`` (``ENOLCK``, ``ENOSYS``, ``EOPNOTSUPP``) there is no fence: a
warning says so once per directory (docs/reliability.md, "Shared file systems").
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hallulog.contracts.errors import HallulogError
from hallulog.contracts.layout import WRITER_LOCK
from hallulog.contracts.process import pid_alive, proc_start
from hallulog.contracts.root_lock import lease_seconds

__all__ = ["WriterBusy", "WriterLock", "hold_writer", "fence_writer", "fence_seconds"]

log = logging.getLogger(__name__)

_POLL_SECONDS = 0.01
_NO_FLOCK = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)
_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)


class WriterBusy(HallulogError):
    """Another live process writes this worker directory."""


class WriterLock:
    """A held writer lock (release it with :meth:`release`, or let the process end)."""

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path, self._fd = path, fd

    def release(self) -> None:
        """Let go of the lock (idempotent)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        os.close(fd)  # closing the last descriptor releases the flock


def _record() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "start": proc_start(os.getpid()),
        "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _read(fd: int) -> dict[str, Any]:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(fd: int) -> None:
    data = json.dumps(_record()).encode() + b"\n"
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _open(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)


def _try_lock(fd: int, path: Path) -> bool | None:
    """True: locked; False: held by another; None: this file system has no flock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in _BUSY:
            return False
        if exc.errno in _NO_FLOCK:
            log.warning(
                "%s: flock is not available here (%s): no writer fence",
                path,
                os.strerror(exc.errno or 0),
            )
            return None
        raise


def _describe(directory: Path, rec: dict[str, Any]) -> str:
    who = (
        f"pid {rec.get('pid')} on {rec.get('host')}, since {rec.get('since')}"
        if rec
        else "another process"
    )
    return f"{directory} is being written by {who} (lock: {directory / WRITER_LOCK})"


def hold_writer(directory: str | Path) -> WriterLock:
    """Take ``directory``'s writer lock for this process, or raise :class:`WriterBusy` naming
    the holder. Called by the writer before it appends anything."""
    directory = Path(directory)
    path = directory / WRITER_LOCK
    fd = _open(path)
    try:
        locked = _try_lock(fd, path)
        if locked is False:
            raise WriterBusy(_describe(directory, _read(fd)))
        _write(fd)
        return WriterLock(path, fd)
    except BaseException:
        os.close(fd)
        raise


def fence_seconds() -> float:
    """How long :func:`fence_writer` waits for a holder on another host: the root lease
    (``HALLULOG_ROOT_LEASE_SECONDS``, 120 s), longer than an NFSv4 server's lease (90 s by
    default) after which it releases a dead client's locks."""
    return lease_seconds()


@contextmanager
def fence_writer(directory: str | Path, *, timeout: float | None = None) -> Iterator[None]:
    """Hold ``directory``'s writer lock while the body runs (the body reads and rolls the
    directory back); any earlier writer is gone first.

    A holder on this host is SIGKILLed: the caller owns the root (its lock), so whatever still
    writes here belongs to no live run. A holder elsewhere is waited for. After ``timeout``
    seconds without the lock, :class:`WriterBusy` names the holder. Nothing to fence (no
    directory yet) yields at once.
    """
    directory = Path(directory)
    if not directory.exists():
        yield
        return
    path = directory / WRITER_LOCK
    fd = _open(path)
    locked: bool | None = False
    timeout = fence_seconds() if timeout is None else timeout
    try:
        deadline = time.monotonic() + timeout
        killed: set[int] = set()
        while True:
            locked = _try_lock(fd, path)
            if locked is not False:
                break
            rec = _read(fd)
            pid = int(rec.get("pid") or 0)
            if pid == os.getpid() and rec.get("host") == socket.gethostname():
                raise WriterBusy(_describe(directory, rec) + ": this process still writes it")
            if (
                rec.get("host") == socket.gethostname()
                and pid > 0
                and pid not in killed
                and pid_alive(pid, rec.get("start"))
            ):
                log.warning(
                    "%s: ending pid %d, a writer left by an earlier session", directory, pid
                )
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                killed.add(pid)
            if time.monotonic() >= deadline:
                raise WriterBusy(_describe(directory, rec) + f"; not released in {timeout:.0f} s")
            time.sleep(_POLL_SECONDS)
        yield
    finally:
        if locked:  # the holder's record is not ours to erase
            try:
                os.ftruncate(fd, 0)
            except OSError:
                pass
        os.close(fd)

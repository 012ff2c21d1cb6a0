"""One writer per artifact root: ``{root}/hallulog.lock``.

Every command that writes a root (run, resume, retry, consolidate, merge into it) holds this
lock for its whole life; a second one is refused with one line naming the holder (command,
pid, host, since). Read-only commands (status, validate, evaluate) never take it.

Two mechanisms, both on the one file (docs/reliability.md):

* ``flock(LOCK_EX | LOCK_NB)`` on the open file. On a local disk the kernel releases it when
  the holder dies however it dies (SIGKILL included), so a dead holder is never in the way.
* A *lease* written into the same file: ``{"pid", "host", "start", "since", "heartbeat",
  "command"}``, the heartbeat rewritten every ``lease / 4`` seconds by a daemon thread. On
  shared file systems where flock is not shared between hosts or not supported (NFS without
  working lock manager, Lustre mounted without ``-o flock``), the lease decides: a holder on
  another host whose heartbeat is younger than the lease (``HALLULOG_ROOT_LEASE_SECONDS``,
  default :data:`LEASE_SECONDS`) holds the root; an older one is stale and taken over. On this
  host a holder whose pid is gone (or reused: the recorded start time differs) is stale at once.

Taking over a stale lease rewrites the file and reads it back after a short settle, so two
takers racing on a file system without flock see one winner. The lock is re-entrant within a
process (``retry`` runs ``run``, ``merge`` consolidates).
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from hallulog.contracts.errors import HallulogError
from hallulog.contracts.process import pid_alive, proc_start

__all__ = ["LOCK_FILE", "LEASE_SECONDS", "RootLocked", "root_lock", "holds_root", "holder_of"]

log = logging.getLogger(__name__)

LOCK_FILE = "hallulog.lock"
LEASE_SECONDS = 120.0
"""A holder on another host whose heartbeat is older than this is taken for dead."""
_RECORD_BYTES = 1024  # the lease is written in one pwrite of this size (space padded)
_SETTLE_SECONDS = 1.0  # lease-only takeover: wait, then check the file still names us

_held: dict[str, _Holder] = {}  # resolved root -> this process's holder (re-entrancy)
_held_lock = threading.Lock()


class RootLocked(HallulogError):
    """Another live process writes this artifact root."""


def lease_seconds() -> float:
    env = os.environ.get("HALLULOG_ROOT_LEASE_SECONDS")
    return float(env) if env else LEASE_SECONDS


def _read(fd: int) -> dict[str, Any] | None:
    try:
        raw = os.pread(fd, _RECORD_BYTES * 2, 0)
    except OSError:
        return None
    text = raw.decode(errors="replace").strip()
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def holder_of(root: str | Path) -> dict[str, Any] | None:
    """The lease recorded in ``root``'s lock file (None: none), live or not."""
    path = Path(root) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return _read(fd)
    finally:
        os.close(fd)


def _describe(root: Path, rec: dict[str, Any] | None) -> str:
    if not rec:
        return (
            f"{root} is in use by another process (its lock {root / LOCK_FILE} is held); "
            "wait for it to end, or pick another --artifact-root"
        )
    return (
        f"{root} is in use by {rec.get('command', 'a hallulog command')} (pid "
        f"{rec.get('pid')} on {rec.get('host')}, since {rec.get('since')}); wait for it to "
        "end or stop it, or pick another --artifact-root (lock: "
        f"{root / LOCK_FILE})"
    )


def _stale(rec: dict[str, Any], lease: float) -> str | None:
    """Why the lease ``rec`` no longer holds the root (None: it still does)."""
    host = socket.gethostname()
    if rec.get("host") == host:
        pid = int(rec.get("pid") or 0)
        if pid == os.getpid():
            return None
        if pid <= 0 or not pid_alive(pid, rec.get("start")):
            return f"pid {pid} on this host is gone"
        return None
    age = time.time() - float(rec.get("heartbeat") or 0)
    if age > lease:
        return f"its heartbeat is {age:.0f} s old (lease {lease:.0f} s)"
    return None


class _Holder:
    def __init__(self, root: Path, fd: int, record: dict[str, Any], lease: float) -> None:
        self.root, self.fd, self.record, self.lease = root, fd, record, lease
        self.count = 1
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="root-lease", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.lease / 4):
            self.record["heartbeat"] = time.time()
            try:
                _write(self.fd, self.record)
            except OSError as exc:
                log.warning("could not renew the lease on %s: %s", self.root / LOCK_FILE, exc)

    def release(self) -> None:
        self._stop.set()
        self._beat.join(timeout=5)
        try:
            os.ftruncate(self.fd, 0)
        except OSError:
            pass
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        except OSError:
            pass
        os.close(self.fd)


def _write(fd: int, record: dict[str, Any]) -> None:
    data = json.dumps(record).encode()
    data = data + b" " * max(0, _RECORD_BYTES - 1 - len(data)) + b"\n"
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))
    os.fsync(fd)


def _acquire(root: Path, command: str, lease: float) -> _Holder:
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        flocked = True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RootLocked(_describe(root, _read(fd))) from None
            # ENOLCK, ENOSYS, EOPNOTSUPP, EINVAL: no flock on this file system; the lease rules
            log.warning(
                "%s: flock is not available here (%s): relying on the lease alone",
                path,
                os.strerror(exc.errno or 0),
            )
            flocked = False
        previous = _read(fd)
        if previous is not None:
            why = _stale(previous, lease)
            if why is None and (not flocked or previous.get("host") != socket.gethostname()):
                raise RootLocked(_describe(root, previous))
            log.warning(
                "taking over %s from %s (pid %s on %s, since %s): %s",
                path,
                previous.get("command"),
                previous.get("pid"),
                previous.get("host"),
                previous.get("since"),
                why or "it no longer holds the lock",
            )
        now = time.time()
        record = {
            "command": command,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "start": proc_start(os.getpid()),
            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(now)),
            "heartbeat": now,
            "token": os.urandom(8).hex(),
        }
        _write(fd, record)
        if not flocked:  # two takers without flock: the file keeps the last writer's token
            time.sleep(_SETTLE_SECONDS)
            if (_read(fd) or {}).get("token") != record["token"]:
                raise RootLocked(_describe(root, _read(fd)))
        return _Holder(root, fd, record, lease)
    except BaseException:
        os.close(fd)
        raise


@contextmanager
def root_lock(root: str | Path, command: str, *, lease: float | None = None) -> Iterator[dict]:
    """Hold ``root`` for ``command`` (e.g. ``"run"``) or raise :class:`RootLocked` naming the
    holder. Yields the lease record. Re-entrant within one process."""
    root = Path(root)
    key = str(root.resolve())
    with _held_lock:
        holder = _held.get(key)
        if holder is not None:
            holder.count += 1
        else:
            holder = _held[key] = _acquire(root, command, lease or lease_seconds())
    try:
        yield holder.record
    finally:
        with _held_lock:
            holder.count -= 1
            if holder.count == 0:
                del _held[key]
                holder.release()


F = TypeVar("F", bound=Callable[..., Any])


def holds_root(command: str) -> Callable[[F], F]:
    """Decorator: the call holds the lock of its artifact root, taken from its first argument
    (a config with ``artifact_root``, or the root path itself)."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(first, *args, **kwargs):
            root = getattr(first, "artifact_root", first)
            with root_lock(root, command):
                return fn(first, *args, **kwargs)

        return inner  # type: ignore[return-value]

    return wrap

"""One writer per artifact root in a bucket: the lease ``PREFIX/.hallulog-run/lock.json``.

A command on an ``s3://`` root works on a node-local staging root, whose POSIX lock
(``contracts/root_lock.py``) covers that node only. Every command that writes the prefix (run,
retry, consolidate, merge ``--out``, evaluate's report, push) also holds this lease in the bucket
for its whole life, so a second writer on any node is refused before it does anything, with one
line naming the holder. Read-only commands (status, validate, pull) take none.

- **Acquire**: a create-only PUT (``If-None-Match: *``) of ``{format, command, host, node, pid,
  start, since, heartbeat, lease, token, epoch}``; ``epoch``, the fencing token, is one more than
  the replaced lease's and every recorded epoch's (``remote/epochs.py``). On 412 the lease is
  read: a holder whose heartbeat is younger than the lease (``HALLULOG_ROOT_LEASE_SECONDS``,
  default 120 s, or the holder's own when longer) refuses the command (:class:`BucketLocked`),
  unless it ran on this machine and in this pid namespace (``node``: boot id and namespace) and
  its pid is gone or reused; a stale or released one is taken over by a PUT conditional on the
  ETag just read (``If-Match``, obstore ``UpdateVersion``): of two takers one wins, the other
  reads again and is refused.
- **Heartbeat**: a daemon thread rewrites the lease every lease/4 seconds, ``If-Match`` the
  ETag it wrote last. A 412 means another command took the lease over (this one stalled past
  the lease): the lease is lost, the main thread is interrupted (a run stops as on SIGTERM),
  :meth:`BucketLease.check` refuses every later segment and file list, and the command ends
  with :class:`BucketLockLost`.
- **Release**: the lease is rewritten with ``released`` (``If-Match`` again), which frees it at
  once; it is not deleted (obstore has no conditional DELETE, and an unconditional one could
  remove a taker's lease). A SIGKILLed holder's lease goes stale after the lease time.
- A server that ignores ``If-Match`` (found by one PUT whose ``If-Match`` matches nothing, once
  per bucket and process) gets a warning, and the lease falls back to read, compare the token,
  write; a takeover is read back after a settle second.

Re-entrant within a process (``retry`` runs the run, the run pushes). docs/object-storage.md.
"""

from __future__ import annotations

import _thread
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hallulog.contracts.process import pid_alive, proc_start
from hallulog.contracts.root_lock import RootLocked, lease_seconds
from hallulog.remote.client import Bucket, ObjectStoreError
from hallulog.remote.epochs import latest_epoch
from hallulog.remote.segments import RUN_PREFIX

__all__ = [
    "LOCK_KEY",
    "BucketLocked",
    "BucketLockLost",
    "BucketLease",
    "bucket_lock",
    "acquire",
    "live_holder",
]

log = logging.getLogger(__name__)

LOCK_KEY = f"{RUN_PREFIX}/lock.json"
LEASE_FORMAT = "hallulog.lease"
_NEVER_MATCHES = '"hallulog-if-match-probe"'
_SETTLE_SECONDS = 1.0  # without If-Match: a takeover is read back after this
_ATTEMPTS = 5

_held: dict[str, BucketLease] = {}  # URL -> this process's lease (re-entrancy)
_held_lock = threading.Lock()
_honours: dict[tuple[str | None, str], bool] = {}  # (endpoint, bucket) -> If-Match honoured


class BucketLocked(RootLocked):
    """Another live command writes this bucket prefix."""


class BucketLockLost(BucketLocked):
    """This command's lease was taken over by another: it writes nothing more."""


def _encode(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, sort_keys=True) + "\n").encode()


def _decode(data: bytes | None) -> dict[str, Any]:
    try:
        rec = json.loads(data or b"")
    except ValueError:
        return {}
    return rec if isinstance(rec, dict) else {}


def _epoch_of(rec: dict[str, Any]) -> int:
    try:
        return int(rec.get("epoch") or 0)
    except (TypeError, ValueError):
        return 0


def _holder(rec: dict[str, Any]) -> str:
    return (
        f"{rec.get('command', 'a hallulog command')} (pid {rec.get('pid')} on "
        f"{rec.get('host')}, since {rec.get('since')})"
    )


def _lease_of(rec: dict[str, Any], lease: float) -> float:
    try:
        return max(lease, float(rec.get("lease") or 0))
    except (TypeError, ValueError):
        return lease


def _age(rec: dict[str, Any]) -> float:
    try:
        return time.time() - float(rec.get("heartbeat") or 0)
    except (TypeError, ValueError):
        return float("inf")


def _node() -> str | None:
    """This machine's boot and this process's pid namespace: a lease's pid names a process of
    this process table only where they match (containers may share a host name)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return None


def _stale(rec: dict[str, Any], lease: float) -> str | None:
    """Why ``rec`` no longer holds the prefix (None: it does)."""
    if rec.get("format") != LEASE_FORMAT:
        return "it is not a hallulog lease"
    if rec.get("released"):
        return "it was released"
    node = _node()
    if node and rec.get("node") == node and rec.get("host") == socket.gethostname():
        pid = rec.get("pid")
        if not isinstance(pid, int) or (
            pid != os.getpid() and not pid_alive(pid, rec.get("start"))
        ):
            return f"pid {pid} on this host is gone"
    lease, age = _lease_of(rec, lease), _age(rec)
    return f"its heartbeat is {age:.0f} s old (lease {lease:.0f} s)" if age > lease else None


def _refusal(bucket: Bucket, rec: dict[str, Any], lease: float) -> str:
    return (
        f"{bucket.url} is in use by {_holder(rec)}; wait for it to end or stop it, or pick "
        f"another prefix (lock: {bucket.display(LOCK_KEY)}, heartbeat {_age(rec):.0f} s ago, "
        f"taken over once older than {_lease_of(rec, lease):.0f} s)"
    )


def _interrupt_main() -> None:
    """Stop the command's main thread: as on SIGTERM where Python handles it (the run loop),
    else as on Ctrl-C."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        if callable(signal.getsignal(sig)):
            _thread.interrupt_main(sig)
            return


class BucketLease:
    """A lease this process holds: renewed by a daemon thread until :meth:`release`."""

    def __init__(
        self, bucket: Bucket, record: dict, etag: str, lease: float, conditional: bool, sent: float
    ) -> None:
        self.bucket, self.record, self.etag, self.lease = bucket, record, etag, lease
        self.conditional = conditional
        """The server honours If-Match (else: read, compare the token, write)."""
        self.confirmed = sent
        """``time.monotonic()`` when the last write that landed was sent."""
        self.count = 1
        self.lost_reason: str | None = None
        self._io = threading.Lock()
        self._closing = False
        self._interrupt = threading.current_thread() is threading.main_thread()
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="bucket-lease", daemon=True)
        self._beat.start()

    @property
    def epoch(self) -> int:
        """This holder's fencing token (``remote/epochs.py``)."""
        return int(self.record["epoch"])

    @property
    def lost(self) -> bool:
        return self.lost_reason is not None

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.lease / 4) and not self.lost:
            try:
                self.renew()
            except ObjectStoreError as exc:  # retried at the next beat
                log.warning("could not renew the lease %s: %s", self.bucket.display(LOCK_KEY), exc)

    def _replace(self, record: dict[str, Any]) -> str | None:
        """Write ``record`` over this lease's last version: the new ETag, or None when another
        command's lease is there (then :meth:`_lose` has been called)."""
        body, etag = _encode(record), self.etag
        found: dict[str, Any] = {}
        for _ in range(2):
            if self.conditional:
                written = self.bucket.put_tagged(LOCK_KEY, body, if_match=etag)
                if written is not None:
                    return written
            got = self.bucket.get_tagged(LOCK_KEY)
            if got is not None and got[0] == body:  # a retried PUT whose first try landed
                return got[1]
            found = _decode(got[0]) if got is not None else {}
            if got is None or found.get("token") != self.record["token"]:
                break
            if not self.conditional:
                return self.bucket.put_tagged(LOCK_KEY, body)
            etag = got[1]  # ours, from a write whose answer was lost: over that one
        self._lose(found)
        return None

    def _lose(self, found: dict[str, Any]) -> None:
        who = _holder(found) if found else "nobody (the lease object is gone)"
        self.lost_reason = (
            f"{self.bucket.url}: this {self.record['command']} lost its lease to {who}: it was "
            f"not renewed within {self.lease:.0f} s; it writes nothing more, what it committed "
            f"before is in the bucket (lock: {self.bucket.display(LOCK_KEY)})"
        )
        log.error("%s", self.lost_reason)
        if self._interrupt and not self._closing:
            _interrupt_main()

    def renew(self) -> bool:
        """Rewrite the heartbeat; False once the lease is lost."""
        with self._io:
            if self.lost or self._closing:
                return not self.lost
            sent = time.monotonic()
            self.record["heartbeat"] = time.time()
            etag = self._replace(self.record)
            if etag is not None:
                self.etag, self.confirmed = etag, sent
            return etag is not None

    def check(self) -> None:
        """Before a write that must not outlive the lease: :class:`BucketLockLost` once another
        command took it over; renewed first when the last renewal is older than half the lease
        (a process that was stopped), an ``ObjectStoreError`` when that fails."""
        if not self.lost and time.monotonic() - self.confirmed > self.lease / 2:
            self.renew()
        if self.lost:
            raise BucketLockLost(self.lost_reason)

    def release(self) -> None:
        with self._io:
            self._closing = True
        self._stop.set()
        self._beat.join(timeout=5)
        if not self._io.acquire(timeout=5):
            log.warning("%s: not released (a renewal hangs)", self.bucket.display(LOCK_KEY))
            return
        try:
            if not self.lost:
                self._replace({**self.record, "released": time.time()})
        except ObjectStoreError as exc:
            log.warning(
                "could not release %s (%s): it goes stale after %.0f s",
                self.bucket.display(LOCK_KEY),
                exc,
                self.lease,
            )
        finally:
            self._io.release()


def _honours_if_match(bucket: Bucket, body: bytes) -> tuple[bool, str | None]:
    """Whether the server refuses a PUT whose If-Match names no version (asked once per bucket
    and process, on the lease object); when it does not, that PUT wrote ``body``: its ETag."""
    where = (bucket.endpoint, bucket.bucket)
    if where in _honours:
        return _honours[where], None
    try:
        etag = bucket.put_tagged(LOCK_KEY, body, if_match=_NEVER_MATCHES)
        why = "wrote over a version that does not exist"
    except ObjectStoreError as exc:  # 501 NotImplemented and the like: nothing written
        etag, why = None, f"refused it: {exc}"
        _honours[where] = False
    else:
        _honours[where] = etag is None
    if not _honours[where]:
        log.warning(
            "%s: a PUT with If-Match %s; the lease falls back to read, compare, write (two "
            "takers of a stale lease within a second may both proceed)",
            bucket.where,
            why,
        )
    return _honours[where], etag


def acquire(bucket: Bucket, command: str, lease: float) -> BucketLease:
    """Take the lease at ``bucket``'s prefix for ``command`` (not re-entrant: :func:`bucket_lock`
    is) or raise :class:`BucketLocked` naming the holder."""
    now = time.time()
    record: dict[str, Any] = {
        "format": LEASE_FORMAT,
        "command": command,
        "host": socket.gethostname(),
        "node": _node(),
        "pid": os.getpid(),
        "start": proc_start(os.getpid()),
        "since": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(now)),
        "heartbeat": now,
        "lease": lease,
        "token": os.urandom(8).hex(),
    }
    found: dict[str, Any] = {}
    recorded = latest_epoch(bucket)
    for _ in range(_ATTEMPTS):
        sent = time.monotonic()
        record["heartbeat"] = time.time()
        record["epoch"] = max(recorded, _epoch_of(found)) + 1  # the fencing token
        body = _encode(record)
        etag = bucket.put_tagged(LOCK_KEY, body, create=True)
        got = None if etag is not None else bucket.get_tagged(LOCK_KEY)
        if got is not None and got[0] == body:  # our create, retried after it landed
            etag = got[1]
        if etag is not None:
            honoured, probed = _honours_if_match(bucket, body)
            return BucketLease(bucket, record, probed or etag, lease, honoured, sent)
        if got is None:  # gone between the two requests: create again
            continue
        found = _decode(got[0])
        why = _stale(found, lease)
        if why is None:
            raise BucketLocked(_refusal(bucket, found, lease))
        log.warning("taking over %s from %s: %s", bucket.display(LOCK_KEY), _holder(found), why)
        record["epoch"] = max(recorded, _epoch_of(found)) + 1
        body = _encode(record)
        honoured, probed = _honours_if_match(bucket, body)
        if honoured:  # of two takers of this version, one wins
            etag = bucket.put_tagged(LOCK_KEY, body, if_match=got[1])
            again = None if etag is not None else bucket.get_tagged(LOCK_KEY)
            if again is not None and again[0] == body:
                etag = again[1]
            if etag is not None:
                return BucketLease(bucket, record, etag, lease, True, sent)
            continue  # another taker, or the holder's heartbeat, came first: read again
        if probed is None:
            bucket.put_tagged(LOCK_KEY, body)
        time.sleep(_SETTLE_SECONDS)  # the last writer of two takers wins: read back
        again = bucket.get_tagged(LOCK_KEY)
        if again is not None and again[0] == body:
            return BucketLease(bucket, record, again[1], lease, False, sent)
    raise BucketLocked(_refusal(bucket, found, lease))


@contextmanager
def bucket_lock(
    where: str | Bucket, command: str, *, lease: float | None = None
) -> Iterator[BucketLease]:
    """Hold the prefix ``where`` (a URL or a :class:`Bucket`) for ``command``, or raise
    :class:`BucketLocked` naming the holder; :class:`BucketLockLost` when the lease was taken
    over meanwhile. Yields the lease (``check()`` it before a commit point). Re-entrant within
    one process."""
    bucket = where if isinstance(where, Bucket) else Bucket(where)
    key = bucket.url
    with _held_lock:
        held = _held.get(key)
        if held is not None:
            held.count += 1
        else:
            held = _held[key] = acquire(bucket, command, lease or lease_seconds())
    try:
        yield held
    except BaseException as exc:
        _leave(key, held)
        if held.lost and not isinstance(exc, BucketLockLost):  # found by the heartbeat or release
            raise BucketLockLost(held.lost_reason) from exc
        raise
    _leave(key, held)
    if held.lost:
        raise BucketLockLost(held.lost_reason)


def _leave(key: str, held: BucketLease) -> None:
    with _held_lock:
        held.count -= 1
        if held.count:
            return
        del _held[key]
    try:
        held.release()
    except KeyboardInterrupt:  # the interrupt of a loss, arriving late
        if not held.lost:
            raise


def live_holder(bucket: Bucket, lease: float | None = None) -> dict[str, Any] | None:
    """The lease record of the command that holds the prefix now, None when none does."""
    got = bucket.get_tagged(LOCK_KEY)
    rec = _decode(got[0]) if got is not None else {}
    if not rec or _stale(rec, lease or lease_seconds()) is not None:
        return None
    return rec

"""Where the pool's workers run: the worker-slot interface and its local implementation.

:class:`~hallulog.orchestrator.run.pool.WorkerPool` keeps the bookkeeping (the queue, free slots,
in-flight groups, deaths, retirement, hang deadlines) and leaves running the workers to a
:class:`WorkerSlots`: worker processes on this machine, one pipe each (:class:`ProcessSlots`,
the default), or Ray actors (``hallulog.orchestrator.run.ray_executor.ActorSlots``). The pool calls it
with the :class:`WorkerSlot` record of each worker; the slots keep their handle in
``slot.proc`` (and a channel in ``slot.conn`` when they have one).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any, Literal, Protocol

from hallulog.workers.worker import WorkerSpec, worker_main

__all__ = ["WorkerSlot", "WorkerSlots", "Notice", "ProcessSlots", "RUNNING", "PARKED", "RETIRED"]

log = logging.getLogger(__name__)

RUNNING, PARKED, RETIRED = "running", "parked", "retired"


@dataclass
class WorkerSlot:
    """One worker of the pool, across its restarts."""

    spec: WorkerSpec
    state: str = PARKED
    proc: Any = None
    """The running worker's handle (a process, an actor); None while it is not running."""
    conn: Any = None
    """Its channel, for slots that have one (the local pipe)."""
    generation: int = 0
    """Incremented at each start: calls and free slots of an earlier start are stale."""
    in_flight: dict[str, None] = field(default_factory=dict)  # insertion-ordered set
    last_heard: float = 0.0
    deaths: int = 0  # consecutive deaths without a resolved group in between
    ready: bool = False  # said "ready": its groups are work on its server now
    why: str = ""


Notice = tuple[int, Literal["event", "started", "dead"], Any]
"""What :meth:`WorkerSlots.wait` reports, in order: ``(worker id, "event", the worker's event)``,
``(worker id, "started", None)`` (a worker whose :meth:`WorkerSlots.spawn` said it starts later
can take groups now) or ``(worker id, "dead", None)`` (it is gone: the pool reaps it)."""


class WorkerSlots(Protocol):
    """How a pool's workers are run; every call comes from the pool's (driver's) thread."""

    def spawn(self, slot: WorkerSlot) -> bool:
        """Start ``slot``'s worker (``slot.generation`` is already the new one). True when it
        takes groups at once; False when a ``started`` notice says so later."""

    def send(self, slot: WorkerSlot, group: Any) -> None:
        """Hand a prompt group to the running worker (a dead one shows up in :meth:`wait`)."""

    def wait(self, slots: dict[int, WorkerSlot], timeout: float) -> Sequence[Notice]:
        """Every notice ready within ``timeout`` seconds (empty on timeout)."""

    def kill(self, slot: WorkerSlot) -> None:
        """End the worker now; :meth:`wait` then reports it dead."""

    def reap(self, slot: WorkerSlot) -> Any:
        """Make sure a dead worker is gone and forget its handle (``slot.proc`` and
        ``slot.conn`` become None); its exit code, or what ended it."""

    def close(self, slots: dict[int, WorkerSlot], timeout: float) -> None:
        """Let every running worker finish what it holds and stop (bounded by ``timeout``),
        then end the stragglers; every handle is forgotten."""

    def kill_all(self, slots: dict[int, WorkerSlot]) -> None:
        """End every worker at once (the run is failing); every handle is forgotten."""

    def observe(self, events: list[dict[str, Any]]) -> None:
        """The events the pool hands the driver (the slots may count them)."""

    def waiting(self, slots: dict[int, WorkerSlot]) -> list[str]:
        """What the slots themselves wait for, for the driver's stall report."""


class ProcessSlots:
    """Worker processes on this machine (``spawn`` start method), one duplex pipe each.

    Nothing is shared between processes that one of them could die holding; a dead worker shows
    up as EOF on its pipe or as its process sentinel in ``multiprocessing.connection.wait``.
    """

    def __init__(self, target: Callable[..., None] = worker_main) -> None:
        self._ctx = mp.get_context("spawn")
        self._target = target
        self._waitables: dict[Any, tuple[int, bool]] | None = None

    def spawn(self, slot: WorkerSlot) -> bool:
        wid = slot.spec.worker_id
        here, there = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(
            target=self._target,
            name=f"hallulog-worker-{wid}",
            args=(slot.spec, there),
            daemon=False,
        )
        proc.start()
        there.close()  # only the worker holds its end: its death is our EOF
        slot.proc, slot.conn = proc, here
        self._waitables = None
        return True

    def send(self, slot: WorkerSlot, group: Any) -> None:
        try:
            slot.conn.send(group)
        except OSError:  # dead already: its sentinel is ready, the group is re-queued then
            log.warning(
                "worker %d: pipe closed while sending %s", slot.spec.worker_id, group.prompt_id
            )

    def wait(self, slots: dict[int, WorkerSlot], timeout: float) -> list[Notice]:
        if self._waitables is None:
            self._waitables = {}
            for wid, w in slots.items():
                if w.proc is not None:
                    self._waitables[w.conn] = (wid, False)
                    self._waitables[w.proc.sentinel] = (wid, True)
        if not self._waitables:
            if timeout:
                time.sleep(timeout)
            return []
        notices: list[Notice] = []
        dead: set[int] = set()
        for obj in wait(list(self._waitables), timeout):
            wid, is_sentinel = self._waitables[obj]
            if wid in dead:
                continue
            if not self._drain(wid, slots[wid], notices) or is_sentinel:
                dead.add(wid)
                notices.append((wid, "dead", None))
        return notices

    def _drain(self, wid: int, slot: WorkerSlot, notices: list[Notice]) -> bool:
        """Read what the worker's pipe holds; False at EOF."""
        try:
            while slot.conn.poll():
                notices.append((wid, "event", slot.conn.recv()))
        except (EOFError, OSError):
            return False
        return True

    def kill(self, slot: WorkerSlot) -> None:
        slot.proc.kill()

    def reap(self, slot: WorkerSlot) -> int | None:
        proc = slot.proc
        proc.join(timeout=5)
        if proc.is_alive():  # EOF without an exit: make it one
            proc.kill()
            proc.join(timeout=10)
        slot.conn.close()
        slot.proc = slot.conn = None
        self._waitables = None
        return proc.exitcode

    def close(self, slots: dict[int, WorkerSlot], timeout: float) -> None:
        for w in slots.values():
            if w.conn is not None:
                try:
                    w.conn.send(None)
                except OSError:
                    pass
        deadline = time.monotonic() + timeout
        for wid, w in slots.items():
            if w.proc is None:
                continue
            w.proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if w.proc.is_alive():
                log.warning("worker %d did not exit in %.0f s: terminating", wid, timeout)
                w.proc.terminate()
                w.proc.join(timeout=10)
                if w.proc.is_alive():
                    w.proc.kill()
                    w.proc.join()
            w.conn.close()
            w.proc = w.conn = None
        self._waitables = None

    def kill_all(self, slots: dict[int, WorkerSlot]) -> None:
        live = [w for w in slots.values() if w.proc is not None]
        for w in live:
            if w.proc.is_alive():
                w.proc.kill()
        for w in live:
            w.proc.join(timeout=10)
            w.conn.close()
            w.proc = w.conn = None
        self._waitables = None

    def observe(self, events: Iterable[dict[str, Any]]) -> None:
        pass

    def waiting(self, slots: dict[int, WorkerSlot]) -> list[str]:
        return []

"""The driver's pool of workers: the queue, dispatch to free slots, re-queue on death.

Where the workers run is a :class:`~hallulog.orchestrator.run.slots.WorkerSlots`: by default worker
processes on this machine (``ProcessSlots``), or Ray actors
(``hallulog.orchestrator.run.ray_executor.ActorSlots``). Locally every worker has its own duplex pipe
(``multiprocessing.Pipe``): the driver sends it prompt groups, never more than its
``groups_in_flight`` unresolved at once, and receives one event per group back. Nothing is
shared between processes that one of them could die holding (the shared
``multiprocessing.Queue`` this replaces kept a lock that a worker SIGKILLed inside ``get`` never
released). A dead worker shows up as EOF on its pipe or its process sentinel in
``multiprocessing.connection.wait``; its in-flight groups are re-queued (minus those it
committed) and it is started again.

Groups wait in one driver-side deque and go to whichever worker frees a slot first, so a slow
server simply gets fewer groups. Bookkeeping per event is O(1): a deque of free slots, a dict of
in-flight ids per worker and a load counter per server.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from hallulog.contracts.prompt_group import PromptGroup
from hallulog.orchestrator.run.slots import (
    PARKED,
    RETIRED,
    RUNNING,
    ProcessSlots,
    WorkerSlot,
    WorkerSlots,
)
from hallulog.workers.worker import WorkerSpec, worker_main

__all__ = ["WorkerPool", "WorkerSlot", "WorkerSlots", "RUNNING", "PARKED", "RETIRED"]

log = logging.getLogger(__name__)


class WorkerPool:
    """Workers on :class:`~hallulog.orchestrator.run.slots.WorkerSlots` (default: processes with one
    pipe each, ``ProcessSlots(target)``); the driver calls :meth:`next_events` in a loop.

    ``committed_in(worker_id)`` rolls a dead worker's directory back to its last commit and
    returns the prompt ids committed there (they count as done, not re-queued). A worker that
    dies more than ``max_restarts`` times in a row without resolving a group is retired. A
    worker that says nothing for ``hang_seconds`` while it has groups in flight is killed (and
    handled like any dead worker).
    """

    def __init__(
        self,
        specs: list[WorkerSpec],
        *,
        committed_in: Callable[[int], set[str]],
        target: Callable[..., None] = worker_main,
        max_restarts: int = 5,
        hang_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        slots: WorkerSlots | None = None,
    ) -> None:
        self.slots: WorkerSlots = slots if slots is not None else ProcessSlots(target)
        self._committed_in = committed_in
        self.max_restarts = max_restarts
        self.hang_seconds = hang_seconds
        self._clock = clock
        self.workers = {s.worker_id: WorkerSlot(s) for s in specs}
        self.server_load: dict[str, int] = {s.server_url: 0 for s in specs}
        self.outstanding: set[str] = set()
        """Groups taken from the queue and not yet resolved (in flight or re-queued)."""
        self._groups: dict[str, PromptGroup] = {}
        self._pending: deque[PromptGroup] = deque()  # re-queued groups go first
        self._sources: deque[Iterator[PromptGroup]] = deque()
        self._unpulled = 0  # groups the sources still owe
        self._free: deque[tuple[int, int]] = deque()  # (worker id, generation): one per slot
        self._events: list[dict[str, Any]] = []  # produced by the pool itself
        self._closing = False

    # ---- lifecycle ---------------------------------------------------------------------------

    @property
    def specs(self) -> dict[int, WorkerSpec]:
        return {wid: w.spec for wid, w in self.workers.items()}

    def workers_of(self, server_url: str) -> list[int]:
        return [wid for wid, w in self.workers.items() if w.spec.server_url == server_url]

    def busy(self, server_url: str) -> bool:
        """Whether a worker that is up has groups in flight on this server (the watchdog's
        view: a worker still starting has sent no request yet)."""
        return any(
            w.ready and w.in_flight
            for w in self.workers.values()
            if w.spec.server_url == server_url
        )

    def start(self, worker_ids: Iterable[int] | None = None) -> None:
        """Start these workers (default: all that are not running or retired). Their free
        slots are interleaved, so that a few groups spread over the workers (and servers)."""
        started = [
            wid
            for wid in (list(self.workers) if worker_ids is None else worker_ids)
            if self.workers[wid].state != RETIRED and self.workers[wid].proc is None
        ]
        # a worker that starts later (an actor Ray has yet to place) gets its slots then
        started = [wid for wid in started if self._spawn(wid, slots=False)]
        for slot in range(max((self.workers[w].spec.groups_in_flight for w in started), default=0)):
            self._free.extend(
                (wid, self.workers[wid].generation)
                for wid in started
                if slot < self.workers[wid].spec.groups_in_flight
            )
        self._dispatch()

    def _spawn(self, wid: int, slots: bool = True) -> bool:
        """Start worker ``wid``; whether it takes groups at once (with ``slots``, its free
        slots are given now; else :meth:`_started` gives them when the slots say so)."""
        w = self.workers[wid]
        w.state, w.ready = RUNNING, False
        w.generation += 1
        w.last_heard = self._clock()
        now = self.slots.spawn(w)
        if now and slots:
            self._free.extend([(wid, w.generation)] * w.spec.groups_in_flight)
        return now

    def _started(self, wid: int) -> None:
        """A worker that started later can take groups now."""
        w = self.workers[wid]
        w.last_heard = self._clock()
        self._free.extend([(wid, w.generation)] * w.spec.groups_in_flight)

    def stop_workers(self, worker_ids: Iterable[int], why: str) -> None:
        """Kill these workers now and keep them down (their server is down); their groups are
        re-queued for the others. :meth:`start` brings them back."""
        for wid in worker_ids:
            w = self.workers[wid]
            if w.state == RETIRED:
                continue
            w.state, w.why = PARKED, why
            if w.proc is not None:
                self.slots.kill(w)
                self._on_death(wid)
        self._dispatch()

    def retire_workers(self, worker_ids: Iterable[int], why: str) -> None:
        """Stop these workers for good (their server is retired)."""
        self.stop_workers(worker_ids, why)
        for wid in worker_ids:
            self.workers[wid].state = RETIRED

    def running(self) -> int:
        """How many workers are running."""
        return sum(1 for w in self.workers.values() if w.state == RUNNING)

    def retired_reasons(self) -> dict[int, str]:
        return {wid: w.why for wid, w in self.workers.items() if w.state == RETIRED}

    # ---- work --------------------------------------------------------------------------------

    def submit(self, groups: Iterable[PromptGroup], count: int | None = None) -> None:
        """Queue groups (each is resolved by a done/failed/recovered event before close).

        With ``count`` (how many groups ``groups`` yields), ``groups`` is pulled lazily, one
        group per free slot: a run streams its task file instead of holding every prompt.
        """
        if count is None:
            groups = list(groups)
            count = len(groups)
        self._sources.append(iter(groups))
        self._unpulled += count
        self._dispatch()

    def retry(self, group: PromptGroup) -> None:
        """Queue ``group`` again after it failed on a retryable error (the driver waited its
        backoff, run.dispatch); it goes before the groups not taken yet."""
        self._groups[group.prompt_id] = group
        self.outstanding.add(group.prompt_id)
        self._pending.append(group)
        self._dispatch()

    @property
    def remaining(self) -> int:
        """Groups not resolved yet: taken and unresolved, plus those still to be taken."""
        return len(self.outstanding) + self._unpulled

    def _next_group(self) -> PromptGroup | None:
        """A re-queued group, else the next from the sources (registered as outstanding)."""
        if self._pending:
            return self._pending.popleft()
        while self._sources:
            group = next(self._sources[0], None)
            if group is None:
                self._sources.popleft()
                continue
            self._unpulled = max(0, self._unpulled - 1)
            self._groups[group.prompt_id] = group
            self.outstanding.add(group.prompt_id)
            return group
        if self._unpulled:
            log.warning("the queued sources ended %d group(s) short of their count", self._unpulled)
            self._unpulled = 0
        return None

    def _dispatch(self) -> None:
        while self._free and (self._pending or self._unpulled):
            wid, generation = self._free.popleft()
            w = self.workers[wid]
            if w.state != RUNNING or w.generation != generation:
                continue  # a slot of a worker that has since died
            group = self._next_group()
            if group is None:
                self._free.appendleft((wid, generation))
                return
            if not w.in_flight:
                w.last_heard = self._clock()
            w.in_flight[group.prompt_id] = None
            self.server_load[w.spec.server_url] += 1
            self._events.append(
                {"event": "dispatched", "worker_id": wid, "prompt_id": group.prompt_id}
            )
            self._send(wid, group)

    def _send(self, wid: int, group: PromptGroup) -> None:
        self.slots.send(self.workers[wid], group)

    def next_events(self, timeout: float) -> list[dict[str, Any]]:
        """Every event ready within ``timeout`` s (empty on timeout), bookkeeping done.

        Worker events: ``done``, ``failed``, ``fatal``. The pool's own: ``dispatched`` (a group
        sent to a worker), ``recovered`` (a dead worker had committed it: done),
        ``worker_died`` and ``worker_retired``.
        """
        if self._events:
            timeout = 0
        dead: list[int] = []
        for wid, kind, payload in self.slots.wait(self.workers, timeout):
            if wid in dead:
                continue
            if kind == "event":
                self._handle(wid, payload)
            elif kind == "started":
                self._started(wid)
            else:
                dead.append(wid)
        for wid in dead:
            self._on_death(wid)
        self._dispatch()
        events, self._events = self._events, []
        self.slots.observe(events)
        return events

    def _handle(self, wid: int, event: dict[str, Any]) -> None:
        w = self.workers[wid]
        w.last_heard = self._clock()
        kind, pid = event.get("event"), event.get("prompt_id")
        if kind == "ready":
            w.ready = True
            return
        if kind in ("done", "failed", "requeue"):
            if pid not in w.in_flight:
                log.warning("worker %d reported %s for %s, which it did not hold", wid, kind, pid)
                return
            del w.in_flight[pid]
            self.server_load[w.spec.server_url] -= 1
            if kind == "requeue":  # a worker that went fatal hands back what it holds
                self._pending.appendleft(self._groups[pid])
                return
            self.outstanding.discard(pid)
            group = self._groups.pop(pid, None)
            if kind == "failed" and event.get("retryable") and group is not None:
                event["group"] = group  # the driver may queue it again (run.dispatch)
            w.deaths = 0
            self._free.append((wid, w.generation))
        self._events.append(event)

    def _on_death(self, wid: int) -> None:
        """A worker is gone: re-queue its in-flight groups (minus the committed ones) and start
        it again, or retire it after ``max_restarts`` deaths in a row."""
        w = self.workers[wid]
        lost = list(w.in_flight)
        exitcode = self.slots.reap(w)
        w.in_flight = {}
        self.server_load[w.spec.server_url] -= len(lost)
        committed = self._committed_in(wid)  # rolls the directory back before any restart
        requeued = []
        for pid in reversed(lost):
            if pid in committed:
                self.outstanding.discard(pid)
                self._groups.pop(pid, None)
                self._events.append({"event": "recovered", "worker_id": wid, "prompt_id": pid})
            else:
                requeued.append(pid)
                self._pending.appendleft(self._groups[pid])
        expected = self._closing or w.state != RUNNING
        if not expected or lost:
            log.log(
                logging.INFO if expected else logging.ERROR,
                "worker %d %s (exit code %s) with %d group(s) in flight: re-queued %s",
                wid,
                "stopped" if expected else "died",
                exitcode,
                len(lost),
                ", ".join(reversed(requeued)) or "none",
            )
        self._events.append(
            {
                "event": "worker_died",
                "worker_id": wid,
                "exitcode": exitcode,
                "requeued": len(requeued),
                "expected": expected,
            }
        )
        if expected:
            return
        w.deaths += 1
        if w.deaths > self.max_restarts:
            w.state = RETIRED
            w.why = f"died {w.deaths} times in a row (last exit code {exitcode})"
            log.error("worker %d retired: %s; see its errors.jsonl", wid, w.why)
            self._events.append({"event": "worker_retired", "worker_id": wid, "why": w.why})
            return
        self._spawn(wid)

    # ---- deadlines ---------------------------------------------------------------------------

    def kill_hung(self) -> list[int]:
        """Kill workers silent for ``hang_seconds`` with groups in flight; returns their ids."""
        if self.hang_seconds is None:
            return []
        now, hung = self._clock(), []
        for wid, w in self.workers.items():
            if w.proc is not None and w.in_flight and now - w.last_heard > self.hang_seconds:
                log.error(
                    "worker %d said nothing for %.0f s with %s in flight: killing it",
                    wid,
                    now - w.last_heard,
                    ", ".join(w.in_flight),
                )
                self.slots.kill(w)
                hung.append(wid)
        return hung

    def describe_wait(self) -> str:
        """What the driver is waiting for: groups per worker, and the queue."""
        parts = [
            f"worker {wid} ({w.state}, {w.spec.server_url}): {', '.join(w.in_flight)}"
            for wid, w in self.workers.items()
            if w.in_flight
        ]
        queued = len(self._pending) + self._unpulled
        return "; ".join(parts + [f"{queued} group(s) queued"] + self.slots.waiting(self.workers))

    # ---- shutdown ----------------------------------------------------------------------------

    def close(self, timeout: float = 60.0) -> None:
        """Tell every worker to finish, wait (bounded), and end stragglers."""
        self._closing = True
        self.slots.close(self.workers, timeout)

    def kill(self) -> None:
        """Stop every worker at once (orchestrator shutting down on an error)."""
        self._closing = True
        self.slots.kill_all(self.workers)

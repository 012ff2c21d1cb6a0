"""The worker processes and the driver's end of their channels.

Every worker has its own duplex pipe (``multiprocessing.Pipe``): the driver sends it prompt
groups, never more than its ``groups_in_flight`` unresolved at once, and receives one event per
group back. Nothing is shared between processes that one of them could die holding (the shared
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
import multiprocessing as mp
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any, Callable, Iterable, Iterator

from contracts.prompt_group import PromptGroup
from workers.worker import WorkerSpec, worker_main

__all__ = ["WorkerPool"]

log = logging.getLogger(__name__)

RUNNING, PARKED, RETIRED = "running", "parked", "retired"


@dataclass
class _Worker:
    spec: WorkerSpec
    state: str = PARKED
    proc: Any = None
    conn: Any = None
    generation: int = 0
    in_flight: dict[str, None] = field(default_factory=dict)  # insertion-ordered set
    last_heard: float = 0.0
    deaths: int = 0  # consecutive deaths without a resolved group in between
    ready: bool = False  # said "ready": its groups are work on its server now
    why: str = ""


class WorkerPool:
    """Worker processes, one pipe each; the driver calls :meth:`next_events` in a loop.

    ``committed_in(worker_id)`` rolls a dead worker's directory back to its last commit and
    returns the prompt ids committed there (they count as done, not re-queued). A worker that
    dies more than ``max_restarts`` times in a row without resolving a group is retired. A
    worker that says nothing for ``hang_seconds`` while it has groups in flight is killed (and
    handled like any dead worker).
    """

    def __init__(self, specs: list[WorkerSpec], *, committed_in: Callable[[int], set[str]],
                 target: Callable[..., None] = worker_main, max_restarts: int = 5,
                 hang_seconds: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._ctx = mp.get_context("spawn")
        self._target = target
        self._committed_in = committed_in
        self.max_restarts = max_restarts
        self.hang_seconds = hang_seconds
        self._clock = clock
        self.workers = {s.worker_id: _Worker(s) for s in specs}
        self.server_load: dict[str, int] = {s.server_url: 0 for s in specs}
        self.outstanding: set[str] = set()
        """Groups taken from the queue and not yet resolved (in flight or re-queued)."""
        self._groups: dict[str, PromptGroup] = {}
        self._pending: deque[PromptGroup] = deque()  # re-queued groups go first
        self._sources: deque[Iterator[PromptGroup]] = deque()
        self._unpulled = 0  # groups the sources still owe
        self._free: deque[tuple[int, int]] = deque()  # (worker id, generation): one per slot
        self._events: list[dict[str, Any]] = []  # produced by the pool itself
        self._waitables: dict[Any, tuple[int, bool]] | None = None
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
        return any(w.ready and w.in_flight for w in self.workers.values()
                   if w.spec.server_url == server_url)

    def start(self, worker_ids: Iterable[int] | None = None) -> None:
        """Start these workers (default: all that are not running or retired). Their free
        slots are interleaved, so that a few groups spread over the workers (and servers)."""
        started = [wid for wid in (list(self.workers) if worker_ids is None else worker_ids)
                   if self.workers[wid].state != RETIRED and self.workers[wid].proc is None]
        for wid in started:
            self._spawn(wid, slots=False)
        for slot in range(max((self.workers[w].spec.groups_in_flight for w in started),
                              default=0)):
            self._free.extend((wid, self.workers[wid].generation) for wid in started
                              if slot < self.workers[wid].spec.groups_in_flight)
        self._dispatch()

    def _spawn(self, wid: int, slots: bool = True) -> None:
        w = self.workers[wid]
        here, there = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=self._target, name=f"hallulog-worker-{wid}",
                                 args=(w.spec, there), daemon=False)
        proc.start()
        there.close()  # only the worker holds its end: its death is our EOF
        w.proc, w.conn, w.state, w.ready = proc, here, RUNNING, False
        w.generation += 1
        w.last_heard = self._clock()
        if slots:
            self._free.extend([(wid, w.generation)] * w.spec.groups_in_flight)
        self._waitables = None

    def stop_workers(self, worker_ids: Iterable[int], why: str) -> None:
        """Kill these workers now and keep them down (their server is down); their groups are
        re-queued for the others. :meth:`start` brings them back."""
        for wid in worker_ids:
            w = self.workers[wid]
            if w.state == RETIRED:
                continue
            w.state, w.why = PARKED, why
            if w.proc is not None:
                self._kill(w)
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
            log.warning("the queued sources ended %d group(s) short of their count",
                        self._unpulled)
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
            self._events.append({"event": "dispatched", "worker_id": wid,
                                 "prompt_id": group.prompt_id})
            self._send(wid, group)

    def _send(self, wid: int, group: PromptGroup) -> None:
        try:
            self.workers[wid].conn.send(group)
        except OSError:  # dead already: its sentinel is ready, the group is re-queued then
            log.warning("worker %d: pipe closed while sending %s", wid, group.prompt_id)

    def next_events(self, timeout: float) -> list[dict[str, Any]]:
        """Every event ready within ``timeout`` s (empty on timeout), bookkeeping done.

        Worker events: ``done``, ``failed``, ``fatal``. The pool's own: ``dispatched`` (a group
        sent to a worker), ``recovered`` (a dead worker had committed it: done),
        ``worker_died`` and ``worker_retired``.
        """
        if self._events:
            timeout = 0
        if self._waitables is None:
            self._waitables = {}
            for wid, w in self.workers.items():
                if w.proc is not None:
                    self._waitables[w.conn] = (wid, False)
                    self._waitables[w.proc.sentinel] = (wid, True)
        ready = wait(list(self._waitables), timeout) if self._waitables else []
        if not self._waitables and timeout:
            time.sleep(timeout)
        dead: list[int] = []
        for obj in ready:
            wid, is_sentinel = self._waitables[obj]
            if wid in dead:
                continue
            if not self._drain(wid) or is_sentinel:
                dead.append(wid)
        for wid in dead:
            self._on_death(wid)
        self._dispatch()
        events, self._events = self._events, []
        return events

    def _drain(self, wid: int) -> bool:
        """Handle what the worker's pipe holds; False at EOF."""
        w = self.workers[wid]
        try:
            while w.conn.poll():
                self._handle(wid, w.conn.recv())
        except (EOFError, OSError):
            return False
        return True

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
            self._groups.pop(pid, None)
            w.deaths = 0
            self._free.append((wid, w.generation))
        self._events.append(event)

    def _reap(self, w: _Worker) -> int | None:
        """Make sure a dead worker's process is gone; its exit code."""
        proc = w.proc
        proc.join(timeout=5)
        if proc.is_alive():  # EOF without an exit: make it one
            proc.kill()
            proc.join(timeout=10)
        w.conn.close()
        w.proc = w.conn = None
        return proc.exitcode

    def _kill(self, w: _Worker) -> None:
        w.proc.kill()

    def _on_death(self, wid: int) -> None:
        """A worker is gone: re-queue its in-flight groups (minus the committed ones) and start
        it again, or retire it after ``max_restarts`` deaths in a row."""
        w = self.workers[wid]
        lost = list(w.in_flight)
        exitcode = self._reap(w)
        w.in_flight = {}
        self._waitables = None
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
            log.log(logging.INFO if expected else logging.ERROR,
                    "worker %d %s (exit code %s) with %d group(s) in flight: re-queued %s",
                    wid, "stopped" if expected else "died", exitcode, len(lost),
                    ", ".join(reversed(requeued)) or "none")
        self._events.append({"event": "worker_died", "worker_id": wid,
                             "exitcode": exitcode, "requeued": len(requeued),
                             "expected": expected})
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
                log.error("worker %d said nothing for %.0f s with %s in flight: killing it", wid,
                          now - w.last_heard, ", ".join(w.in_flight))
                self._kill(w)
                hung.append(wid)
        return hung

    def describe_wait(self) -> str:
        """What the driver is waiting for: groups per worker, and the queue."""
        parts = [f"worker {wid} ({w.state}, {w.spec.server_url}): {', '.join(w.in_flight)}"
                 for wid, w in self.workers.items() if w.in_flight]
        queued = len(self._pending) + self._unpulled
        return "; ".join(parts + [f"{queued} group(s) queued"])

    # ---- shutdown ----------------------------------------------------------------------------

    def close(self, timeout: float = 60.0) -> None:
        """Tell every worker to finish, wait (bounded), and terminate stragglers."""
        self._closing = True
        for w in self.workers.values():
            if w.conn is not None:
                try:
                    w.conn.send(None)
                except OSError:
                    pass
        deadline = self._clock() + timeout
        for wid, w in self.workers.items():
            if w.proc is None:
                continue
            w.proc.join(timeout=max(0.0, deadline - self._clock()))
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

    def kill(self) -> None:
        """Stop every worker at once (orchestrator shutting down on an error)."""
        self._closing = True
        live = [w for w in self.workers.values() if w.proc is not None]
        for w in live:
            if w.proc.is_alive():
                w.proc.kill()
        for w in live:
            w.proc.join(timeout=10)
            w.conn.close()
            w.proc = w.conn = None
        self._waitables = None

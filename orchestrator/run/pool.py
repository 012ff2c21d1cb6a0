"""The in-memory queue and the worker processes (spawn context) that consume it.

The pool hands out prompt groups, tracks which groups each worker has in flight, and when a
worker process dies re-queues those groups and starts it again.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import queue
from dataclasses import replace
from typing import Any, Callable, Iterable

from contracts.prompt_group import PromptGroup
from workers.worker import WorkerSpec, worker_main

__all__ = ["WorkerPool"]

log = logging.getLogger(__name__)


class WorkerPool:
    """N worker processes reading one task queue and writing one result queue."""

    def __init__(self, specs: list[WorkerSpec], *, max_restarts: int = 3) -> None:
        self._ctx = mp.get_context("spawn")
        self.tasks = self._ctx.Queue()
        self.results = self._ctx.Queue()
        self.specs = {s.worker_id: s for s in specs}
        self.processes: dict[int, Any] = {}
        self.in_flight: dict[int, set[str]] = {s.worker_id: set() for s in specs}
        self.restarts: dict[int, int] = {s.worker_id: 0 for s in specs}
        self.max_restarts = max_restarts
        self._groups: dict[str, PromptGroup] = {}
        self.outstanding: set[str] = set()
        self._closed = False

    def start(self) -> None:
        for worker_id in self.specs:
            self._spawn(worker_id)

    def _spawn(self, worker_id: int) -> None:
        proc = self._ctx.Process(target=worker_main, name=f"hallulog-worker-{worker_id}",
                                 args=(self.specs[worker_id], self.tasks, self.results),
                                 daemon=False)
        proc.start()
        self.processes[worker_id] = proc

    def submit(self, groups: Iterable[PromptGroup]) -> None:
        """Queue groups (each must be resolved by a done/failed event before close)."""
        for group in groups:
            self._groups[group.prompt_id] = group
            self.outstanding.add(group.prompt_id)
            self.tasks.put(group)

    def next_event(self, timeout: float) -> dict[str, Any] | None:
        """The next worker event (None on timeout); keeps in-flight bookkeeping."""
        try:
            event = self.results.get(timeout=timeout)
        except queue.Empty:
            return None
        wid, pid = event.get("worker_id"), event.get("prompt_id")
        kind = event["event"]
        if kind == "started":
            self.in_flight[wid].add(pid)
        elif kind in ("done", "failed"):
            self.in_flight[wid].discard(pid)
            self.outstanding.discard(pid)
        elif kind == "requeue":
            self.in_flight[wid].discard(pid)
            self.tasks.put(self._groups[pid])
        return event

    def check_workers(self, committed_in: Callable[[int], set[str]]) -> list[str]:
        """Restart workers that died; re-queue their in-flight groups.

        ``committed_in(worker_id)`` rolls the dead worker's directory back and returns the prompt
        ids it committed: those count as done, not re-queued. Returns those prompt ids.
        """
        recovered: list[str] = []
        for wid, proc in list(self.processes.items()):
            if proc.is_alive() or proc.exitcode == 0 or self._closed:
                continue
            lost = self.in_flight[wid]
            log.error("worker %d died (exit code %s) with %d group(s) in flight", wid,
                      proc.exitcode, len(lost))
            committed = committed_in(wid)
            for pid in sorted(lost):
                if pid in committed:
                    recovered.append(pid)
                    self.outstanding.discard(pid)
                else:
                    self.tasks.put(self._groups[pid])
            self.in_flight[wid] = set()
            if self.restarts[wid] >= self.max_restarts:
                raise RuntimeError(f"worker {wid} died {self.restarts[wid] + 1} times; giving up "
                                   "(see its errors.jsonl and the log above)")
            self.restarts[wid] += 1
            self._spawn(wid)
        return recovered

    def retarget(self, worker_ids: Iterable[int], server_url: str) -> None:
        """Point future restarts of these workers at another server URL."""
        for wid in worker_ids:
            self.specs[wid] = replace(self.specs[wid], server_url=server_url)

    def close(self, timeout: float = 60.0) -> None:
        """Tell every worker to finish, wait, and terminate stragglers."""
        self._closed = True
        for _ in self.processes:
            self.tasks.put(None)
        for wid, proc in self.processes.items():
            proc.join(timeout=timeout)
            if proc.is_alive():
                log.warning("worker %d did not exit: terminating", wid)
                proc.terminate()
                proc.join(timeout=10)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
        # drain so the queues' feeder threads can exit
        for q in (self.tasks, self.results):
            try:
                while True:
                    q.get_nowait()
            except (queue.Empty, OSError, ValueError):
                pass

    def kill_workers(self, worker_ids: Iterable[int]) -> None:
        """SIGKILL these workers; ``check_workers`` then re-queues their groups and restarts
        them (used when their server is restarted under them)."""
        for wid in worker_ids:
            proc = self.processes.get(wid)
            if proc is not None and proc.is_alive():
                proc.kill()
                proc.join(timeout=10)

    def kill(self) -> None:
        """Stop every worker at once (orchestrator shutting down on an error)."""
        self._closed = True
        # Nobody will read what is still queued: do not let interpreter exit wait on the pipes.
        self.tasks.cancel_join_thread()
        self.results.cancel_join_thread()
        for proc in self.processes.values():
            if proc.is_alive():
                proc.kill()
        for proc in self.processes.values():
            proc.join(timeout=10)

"""The run loop's middle: feed the pool, consume its events, keep the checkpoint and status.

Per event the work is O(1) (dict and set updates, one board call); ids completed together are
appended to ``completions.log`` with one fsync. About once a second a *tick* advances the
servers' health (``run.fleet``), kills hung workers, writes a ``completed_prompts.json``
snapshot when one is due, says what the loop is waiting for when nothing has happened for a
while, and stops the run when no worker can ever run again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config import RunConfig
from orchestrator.errors import HallulogError
from orchestrator.run.budget import StorageMeter
from orchestrator.run.checkpoint import CheckpointWriter, CompletionLog
from orchestrator.run.fleet import ServerFleet
from orchestrator.run.pool import WorkerPool
from orchestrator.run.progress import Progress
from orchestrator.run.status import StatusBoard
from orchestrator.run.watchdog import Watchdog

__all__ = ["Drive", "WAIT_REPORT_SECONDS"]

log = logging.getLogger(__name__)

WAIT_REPORT_SECONDS = 60.0
"""Silence (no event) after which the loop logs what it waits for, and again as often."""


@dataclass
class Drive:
    """Everything the loop touches; :meth:`run` drains the pool."""

    pool: WorkerPool
    config: RunConfig
    board: StatusBoard
    progress: Progress
    completions: CompletionLog
    snapshots: CheckpointWriter
    completed: set[str]
    result: Any  # RunResult
    fleet: ServerFleet | None = None
    watchdog: Watchdog | None = None
    meter: StorageMeter | None = None
    """``--max-storage-gb``: polled after each batch of events; raises StorageCapReached."""
    tick_seconds: float = 1.0
    _batch: list[str] = field(default_factory=list)

    def run(self) -> None:
        now = time.monotonic()
        last_tick = last_event = last_report = last_snapshot = now
        since_snapshot = 0
        every = self.config.checkpoint_every
        while self.pool.remaining:
            events = self.pool.next_events(timeout=0.5)
            for event in events:
                self._handle(event)
            if self._batch:
                since_snapshot += len(self._batch)
                self.completions.append(self._batch)
                self._batch = []
            if events and self.meter is not None:
                self.meter.poll()  # after the completions are logged: they stay done
            now = time.monotonic()
            if events:
                last_event = now
            if now - last_tick < self.tick_seconds:
                continue
            last_tick = now
            if self.fleet is not None:
                self.fleet.poll(self.watchdog.stalled() if self.watchdog is not None else ())
            self.pool.kill_hung()
            if since_snapshot and (now - last_snapshot >= self.config.checkpoint_interval
                                   or (every is not None and since_snapshot >= every)):
                self.snapshots.request(self.completed)
                last_snapshot, since_snapshot = now, 0
            if now - max(last_event, last_report) >= WAIT_REPORT_SECONDS:
                last_report = now
                log.warning("no event for %.0f s; waiting for %s", now - last_event,
                            self.pool.describe_wait())
            self._check_can_finish()

    def _handle(self, event: dict[str, Any]) -> None:
        kind, wid, pid = event["event"], event.get("worker_id"), event.get("prompt_id")
        board = self.board
        if kind == "dispatched":
            board.group_started(wid, pid)
            board.worker_update(wid, state="generating", current_prompt=pid)
        elif kind in ("done", "recovered"):
            generations = event.get("generations", self.config.k_samples + 1)
            tokens, capture_errors = event.get("tokens", 0), event.get("capture_errors", 0)
            self.completed.add(pid)
            self._batch.append(pid)
            self.result.done += 1
            self.result.capture_errors += capture_errors
            for name, n in (event.get("positions_missing") or {}).items():
                missing = self.result.positions_missing
                missing[name] = missing.get(name, 0) + int(n)
            board.group_done(wid, pid, generations=generations, tokens=tokens)
            self.progress.advance(generations=generations, tokens=tokens,
                                  capture_errors=capture_errors)
            if self.fleet is not None:
                self.fleet.progressed(self.pool.workers[wid].spec.server_url)
        elif kind == "failed":
            self.result.failed.append(pid)
            board.group_failed(wid, pid, event["error"])
            self.progress.fail()
            log.error("prompt %s failed on worker %s: %s", pid, wid,
                      event["error"].get("error_message"))
        elif kind == "fatal":
            raise HallulogError(f"worker {wid} stopped: {event['error'].get('error_message')} "
                                "(committed work is kept; fix the cause and rerun to resume)")
        elif kind == "worker_died":
            board.worker_update(wid, state="stopped" if event["expected"] else "restarting")
        elif kind == "worker_retired":
            board.worker_update(wid, state="retired")
        if kind in ("done", "failed") and not self.pool.workers[wid].in_flight:
            board.worker_update(wid, state="idle")

    def _check_can_finish(self) -> None:
        """Raise when outstanding work can never be done: no worker runs and none will."""
        if self.pool.running():
            return
        if self.fleet is not None:
            if self.fleet.all_retired():
                raise HallulogError("every server is retired, none is left to run the "
                                    f"{self.pool.remaining} remaining prompt group(s): "
                                    f"{self.fleet.retired_reasons()} (committed work is kept; "
                                    "fix the cause and rerun to resume)")
            if self.fleet.recovering():
                return
        reasons = "; ".join(f"worker {wid}: {why}"
                            for wid, why in self.pool.retired_reasons().items())
        raise HallulogError(f"no worker is left to run the {self.pool.remaining} "
                            f"remaining prompt group(s): {reasons or 'all stopped'} "
                            "(committed work is kept; see worker_*/errors.jsonl, fix the cause "
                            "and rerun to resume)")

"""The run loop's middle: feed the pool, consume its events, keep the checkpoint and status.

Per event the work is O(1) (dict and set updates, one board call); ids completed together are
appended to ``completions.log`` with one fsync. About once a second a *tick* advances the
servers' health (``run.fleet``), kills hung workers, writes a ``completed_prompts.json``
snapshot when one is due, says what the loop is waiting for when nothing has happened for a
while, and stops the run when no worker can ever run again.

A group that fails on a *retryable* error (timeouts, connection errors, HTTP 429 and 5xx, after
the worker client's own three attempts; ``workers/client.py`` ``is_retryable``) is not given up:
it is queued again after a backoff of ``RETRY_BACKOFF_SECONDS * 2**(n-1)`` (capped at
``RETRY_BACKOFF_CAP_SECONDS``), up to ``RETRY_ATTEMPTS`` more times and while less than
``RETRY_BUDGET_SECONDS`` have passed since its first failure. Only then is it recorded as failed
(``hallulog retry`` redoes it later). A transient outage of a server costs time, not prompts.
Each failed attempt stays in the worker's ``errors.jsonl``.
"""

from __future__ import annotations

import heapq
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from hallulog.config.run_config import RunConfig
from hallulog.contracts.errors import HallulogError
from hallulog.orchestrator.run.budget import StorageMeter
from hallulog.orchestrator.run.checkpoint import CheckpointWriter, CompletionLog
from hallulog.orchestrator.run.fleet import ServerFleet
from hallulog.orchestrator.run.pool import WorkerPool
from hallulog.orchestrator.run.progress import Progress
from hallulog.orchestrator.run.status import StatusBoard
from hallulog.orchestrator.run.watchdog import Watchdog

__all__ = [
    "Drive",
    "WAIT_REPORT_SECONDS",
    "RETRY_ATTEMPTS",
    "RETRY_BACKOFF_SECONDS",
    "RETRY_BACKOFF_CAP_SECONDS",
    "RETRY_BUDGET_SECONDS",
]

log = logging.getLogger(__name__)

WAIT_REPORT_SECONDS = 60.0
"""Silence (no event) after which the loop logs what it waits for, and again as often."""

RETRY_ATTEMPTS = 5
"""Times a group failed on a retryable error is queued again before it is recorded as failed
(``$HALLULOG_GROUP_RETRIES`` overrides it; 0: no re-queue)."""
RETRY_BACKOFF_SECONDS = 5.0
"""Wait before the first re-queue, doubled for each further one
(``$HALLULOG_GROUP_RETRY_BACKOFF`` overrides it)."""
RETRY_BACKOFF_CAP_SECONDS = 60.0
RETRY_BUDGET_SECONDS = 600.0
"""No re-queue once this long has passed since the group's first failure."""


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
    retry_attempts: int = field(
        default_factory=lambda: int(os.environ.get("HALLULOG_GROUP_RETRIES", RETRY_ATTEMPTS))
    )
    retry_backoff: float = field(
        default_factory=lambda: float(
            os.environ.get("HALLULOG_GROUP_RETRY_BACKOFF", RETRY_BACKOFF_SECONDS)
        )
    )
    retry_budget: float = RETRY_BUDGET_SECONDS
    requeued: int = 0
    """Groups queued again after a retryable failure (this session)."""
    _batch: list[str] = field(default_factory=list)
    _retries: list = field(default_factory=list)  # heap of (due, seq, group)
    _attempts: dict[str, tuple[int, float]] = field(default_factory=dict)  # id -> (n, first)

    def run(self) -> None:
        now = time.monotonic()
        last_tick = last_event = last_report = last_snapshot = now
        since_snapshot = 0
        every = self.config.checkpoint_every
        while self.pool.remaining or self._retries:
            self._requeue_due()
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
            if since_snapshot and (
                now - last_snapshot >= self.config.checkpoint_interval
                or (every is not None and since_snapshot >= every)
            ):
                self.snapshots.request(self.completed)
                last_snapshot, since_snapshot = now, 0
            if now - max(last_event, last_report) >= WAIT_REPORT_SECONDS:
                last_report = now
                log.warning(
                    "no event for %.0f s; waiting for %s",
                    now - last_event,
                    self.pool.describe_wait(),
                )
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
            reasons = event.get("capture_reasons") or {}
            for reason, n in reasons.items():
                total = self.result.capture_reasons
                total[reason] = total.get(reason, 0) + int(n)
            for name, n in (event.get("positions_missing") or {}).items():
                missing = self.result.positions_missing
                missing[name] = missing.get(name, 0) + int(n)
            board.group_done(wid, pid, generations=generations, tokens=tokens)
            self.progress.advance(
                generations=generations,
                tokens=tokens,
                capture_errors=capture_errors,
                capture_reasons=reasons,
                no_answer=int(event.get("no_answer", 0)),
            )
            if self.fleet is not None:
                self.fleet.progressed(self.pool.workers[wid].spec.server_url)
        elif kind == "failed":
            if self._retry_later(event):
                return
            self._attempts.pop(pid, None)
            self.result.failed.append(pid)
            board.group_failed(wid, pid, event["error"])
            self.progress.fail()
            log.error(
                "prompt %s failed on worker %s: %s", pid, wid, event["error"].get("error_message")
            )
        elif kind == "fatal":
            raise HallulogError(
                f"worker {wid} stopped: {event['error'].get('error_message')} "
                "(committed work is kept; fix the cause and rerun to resume)"
            )
        elif kind == "worker_died":
            board.worker_update(wid, state="stopped" if event["expected"] else "restarting")
        elif kind == "worker_retired":
            board.worker_update(wid, state="retired")
        if kind in ("done", "failed") and not self.pool.workers[wid].in_flight:
            board.worker_update(wid, state="idle")

    def _retry_later(self, event: dict[str, Any]) -> bool:
        """Schedule a retryable failure's group again (True), unless its budget is spent."""
        group = event.get("group")
        if group is None or not event.get("retryable"):
            return False
        pid, now = event["prompt_id"], time.monotonic()
        n, first = self._attempts.get(pid, (0, now))
        if n >= self.retry_attempts or now - first >= self.retry_budget:
            log.error("prompt %s: giving up after %d re-queue(s) in %.0f s", pid, n, now - first)
            return False
        n += 1
        self._attempts[pid] = (n, first)
        delay = min(RETRY_BACKOFF_CAP_SECONDS, self.retry_backoff * 2 ** (n - 1))
        self.requeued += 1
        heapq.heappush(self._retries, (now + delay, self.requeued, group))
        log.warning(
            "prompt %s failed on worker %s (%s): queued again in %.0f s (re-queue %d "
            "of at most %d)",
            pid,
            event.get("worker_id"),
            event["error"].get("error_message"),
            delay,
            n,
            self.retry_attempts,
        )
        wid = event.get("worker_id")
        if wid is not None and not self.pool.workers[wid].in_flight:
            self.board.worker_update(wid, state="idle")
        return True

    def _requeue_due(self) -> None:
        now = time.monotonic()
        while self._retries and self._retries[0][0] <= now:
            self.pool.retry(heapq.heappop(self._retries)[2])

    def _check_can_finish(self) -> None:
        """Raise when outstanding work can never be done: no worker runs and none will."""
        if self.pool.running():
            return
        if self.fleet is not None:
            if self.fleet.all_retired():
                left = self.pool.remaining + len(self._retries)
                raise HallulogError(
                    "every server is retired, none is left to run the "
                    f"{left} remaining prompt group(s): "
                    f"{self.fleet.retired_reasons()} (committed work is kept; "
                    "fix the cause and rerun to resume)"
                )
            if self.fleet.recovering():
                return
        reasons = "; ".join(
            f"worker {wid}: {why}" for wid, why in self.pool.retired_reasons().items()
        )
        raise HallulogError(
            f"no worker is left to run the "
            f"{self.pool.remaining + len(self._retries)} "
            f"remaining prompt group(s): {reasons or 'all stopped'} "
            "(committed work is kept; see worker_*/errors.jsonl, fix the cause "
            "and rerun to resume)"
        )

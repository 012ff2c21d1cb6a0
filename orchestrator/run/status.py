"""The run's live status board: an in-memory, thread-safe record the run loop updates.

The run loop calls the update methods; the status API only ever calls :meth:`StatusBoard.snapshot`.
Every method takes one private lock for a few microseconds and does no I/O, so a snapshot never
waits on a checkpoint write, a file lock or a slow worker: the board's lock is never held around
anything but dictionary updates. The snapshot's fields are documented in ``docs/status.md``.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from hallulog.contracts.run_phases import RUN_PHASES

__all__ = ["StatusBoard", "PHASES", "SNAPSHOT_VERSION"]

PHASES = RUN_PHASES
SNAPSHOT_VERSION = 1
_WORKING_PHASES = ("starting", "running")


class _Worker:
    __slots__ = (
        "worker_id",
        "state",
        "current_prompt",
        "in_flight",
        "done",
        "errors",
        "generations",
        "tokens",
        "updated_at",
    )

    def __init__(self, worker_id: int, now: float) -> None:
        self.worker_id = worker_id
        self.state = "starting"
        self.current_prompt: str | None = None
        self.in_flight: dict[str, None] = {}  # insertion-ordered set of prompt ids
        self.done = 0
        self.errors = 0
        self.generations = 0
        self.tokens = 0
        self.updated_at = now

    def as_dict(self) -> dict[str, Any]:
        current = self.current_prompt
        if current is None and self.in_flight:
            current = next(reversed(self.in_flight))
        return {
            "id": self.worker_id,
            "state": self.state,
            "current_prompt": current,
            "in_flight": len(self.in_flight),
            "done": self.done,
            "errors": self.errors,
            "generations": self.generations,
            "tokens": self.tokens,
            "updated_at": self.updated_at,
        }


class StatusBoard:
    """Thread-safe, in-memory progress of one run.

    ``total_prompts`` counts every prompt of the run, including the ``skipped`` ones that an
    earlier (resumed) run already completed; ``done`` counts prompt groups completed by this
    process. Rates are measured from the first :meth:`group_started` (server start-up time is not
    throughput) over a sliding ``window_s`` and overall; the overall clock stops when the phase
    leaves ``running``.
    """

    def __init__(
        self,
        *,
        run_id: str,
        config_summary: dict,
        fingerprint: str,
        artifact_root: str,
        total_prompts: int,
        skipped: int = 0,
        k_samples: int = 0,
        window_s: float = 60.0,
        max_errors: int = 20,
        history_bucket_s: float = 10.0,
        history_len: int = 360,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if total_prompts < 0 or skipped < 0 or skipped > total_prompts:
            raise ValueError(f"need 0 <= skipped ({skipped}) <= total_prompts ({total_prompts})")
        if window_s <= 0 or history_bucket_s <= 0 or history_len < 1 or max_errors < 0:
            raise ValueError(
                "window_s and history_bucket_s must be > 0, history_len >= 1, max_errors >= 0"
            )
        self._lock = threading.Lock()
        self._clock = clock
        self._wall = wall_clock
        self._window_s = float(window_s)
        self._bucket_s = float(history_bucket_s)
        self._history_len = int(history_len)
        # Constant after construction: copied once so snapshots can share it read-only.
        self._static = {
            "run_id": run_id,
            "config": copy.deepcopy(config_summary),
            "fingerprint": fingerprint,
            "artifact_root": str(artifact_root),
            "k_samples": int(k_samples),
        }
        self._total = int(total_prompts)
        self._skipped = int(skipped)
        self._phase = "starting"
        self._created_wall = wall_clock()
        self._created = clock()
        self._work_start: float | None = None  # first group_started
        self._work_end: float | None = None  # phase left "running"
        self._updated_wall = self._created_wall
        self._done: set[str] = set()
        self._failed: dict[str, None] = {}
        self._generations = 0
        self._tokens = 0
        self._errors_total = 0
        self._recent: deque[tuple[float, int, int]] = deque()  # (t, generations, tokens)
        self._history: deque[list[float]] = deque(maxlen=self._history_len)  # [bucket, g, t, p]
        self._errors: deque[dict[str, Any]] = deque(maxlen=max_errors)
        self._workers: dict[int, _Worker] = {}
        self._servers: dict[str, dict[str, Any]] = {}
        self._evaluation_report: str | None = None

    # ---- updates (run loop) -------------------------------------------------------------

    def set_phase(self, phase: str) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; expected one of {', '.join(PHASES)}")
        with self._lock:
            now = self._clock()
            if phase not in _WORKING_PHASES and self._work_end is None:
                self._work_end = now
            elif phase in _WORKING_PHASES:
                self._work_end = None
            self._phase = phase
            self._touch()

    def worker_update(
        self, worker_id: int, *, state: str, current_prompt: str | None = None
    ) -> None:
        """Set a worker's state; ``current_prompt=None`` shows its latest in-flight prompt."""
        with self._lock:
            w = self._worker(worker_id)
            w.state = state
            w.current_prompt = current_prompt
            self._touch(w)

    def group_started(self, worker_id: int, prompt_id: str) -> None:
        with self._lock:
            now = self._clock()
            if self._work_start is None:
                self._work_start = now
            w = self._worker(worker_id)
            w.in_flight[prompt_id] = None
            self._touch(w)

    def group_done(self, worker_id: int, prompt_id: str, *, generations: int, tokens: int) -> None:
        with self._lock:
            now = self._clock()
            if self._work_start is None:
                self._work_start = now
            w = self._worker(worker_id)
            self._release(w, prompt_id)
            self._failed.pop(prompt_id, None)  # a retried prompt that now succeeded
            if prompt_id not in self._done:
                self._done.add(prompt_id)
                w.done += 1
            w.generations += generations
            w.tokens += tokens
            self._generations += generations
            self._tokens += tokens
            self._recent.append((now, generations, tokens))
            self._prune(now)
            self._add_history(now, generations, tokens)
            self._touch(w)

    def group_failed(self, worker_id: int, prompt_id: str, error: dict) -> None:
        with self._lock:
            w = self._worker(worker_id)
            self._release(w, prompt_id)
            if prompt_id not in self._done:
                self._failed[prompt_id] = None
            w.errors += 1
            self._errors_total += 1
            entry = {k: v for k, v in error.items() if k != "stack_trace"}
            entry.setdefault("timestamp", self._wall())
            entry["worker_id"] = worker_id
            entry["prompt_id"] = prompt_id
            self._errors.append(entry)
            self._touch(w)

    def server_update(
        self, url: str, *, health: str, restarts: int | None = None, in_flight: int | None = None
    ) -> None:
        with self._lock:
            srv = self._servers.setdefault(
                url,
                {"url": url, "health": health, "restarts": 0, "in_flight": 0, "updated_at": None},
            )
            srv["health"] = health
            if restarts is not None:
                srv["restarts"] = int(restarts)
            if in_flight is not None:
                srv["in_flight"] = int(in_flight)
            srv["updated_at"] = self._wall()
            self._touch()

    def set_evaluation_report(self, path: str | None) -> None:
        """The run's ``evaluation/report.md`` when one exists (the dashboard links it)."""
        with self._lock:
            self._evaluation_report = str(path) if path else None
            self._touch()

    # ---- read (API) ---------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """A consistent, JSON-able copy of the board (see docs/status.md)."""
        with self._lock:
            now = self._clock()
            self._prune(now)
            recent_g = sum(g for _, g, _ in self._recent)
            recent_t = sum(t for _, _, t in self._recent)
            recent_p = len(self._recent)
            done = len(self._done)
            failed = len(self._failed)
            in_flight = sum(len(w.in_flight) for w in self._workers.values())
            workers = [self._workers[k].as_dict() for k in sorted(self._workers)]
            servers = [dict(self._servers[k]) for k in sorted(self._servers)]
            errors = [dict(e) for e in self._errors]
            history = self._history_series(now)
            phase = self._phase
            work_start, work_end = self._work_start, self._work_end
            updated_wall = self._updated_wall
            errors_total = self._errors_total
            evaluation_report = self._evaluation_report
            generations, tokens = self._generations, self._tokens
        # Arithmetic on the copies happens outside the lock.
        if work_start is None:
            elapsed_work = 0.0
            window = 0.0
        else:
            elapsed_work = max(0.0, (work_end if work_end is not None else now) - work_start)
            window = min(self._window_s, max(0.0, now - work_start))
        remaining = max(0, self._total - self._skipped - done - failed)
        rate = _per_s
        recent_prompts_s = rate(recent_p, window)
        if remaining == 0:
            eta = 0.0
        elif phase == "running" and recent_prompts_s > 0:
            eta = remaining / recent_prompts_s
        else:
            eta = None
        progress = (self._skipped + done) / self._total if self._total else 1.0
        return {
            "version": SNAPSHOT_VERSION,
            **copy.deepcopy(self._static),
            "phase": phase,
            "started_at": self._created_wall,
            "updated_at": updated_wall,
            "now": self._wall(),
            "uptime_s": now - self._created,
            "elapsed_s": elapsed_work,
            "prompts": {
                "total": self._total,
                "done": done,
                "failed": failed,
                "in_flight": in_flight,
                "skipped": self._skipped,
                "remaining": remaining,
            },
            "progress": progress,
            "generations": generations,
            "tokens": tokens,
            "errors_total": errors_total,
            "rates": {
                "window_s": self._window_s,
                "prompts_per_s": {"recent": recent_prompts_s, "overall": rate(done, elapsed_work)},
                "generations_per_s": {
                    "recent": rate(recent_g, window),
                    "overall": rate(generations, elapsed_work),
                },
                "tokens_per_s": {
                    "recent": rate(recent_t, window),
                    "overall": rate(tokens, elapsed_work),
                },
            },
            "eta_s": eta,
            "workers": workers,
            "servers": servers,
            "errors": errors,
            "history": history,
            "evaluation_report": evaluation_report,
        }

    # ---- internals (lock held) ----------------------------------------------------------

    def _worker(self, worker_id: int) -> _Worker:
        w = self._workers.get(worker_id)
        if w is None:
            w = self._workers[worker_id] = _Worker(worker_id, self._wall())
        return w

    def _touch(self, w: _Worker | None = None) -> None:
        self._updated_wall = self._wall()
        if w is not None:
            w.updated_at = self._updated_wall

    @staticmethod
    def _release(w: _Worker, prompt_id: str) -> None:
        w.in_flight.pop(prompt_id, None)
        if w.current_prompt == prompt_id:
            w.current_prompt = None

    def _prune(self, now: float) -> None:
        horizon = now - self._window_s
        while self._recent and self._recent[0][0] <= horizon:
            self._recent.popleft()

    def _add_history(self, now: float, generations: int, tokens: int) -> None:
        bucket = int(now // self._bucket_s)
        if self._history and self._history[-1][0] == bucket:
            last = self._history[-1]
            last[1] += generations
            last[2] += tokens
            last[3] += 1
        else:
            self._history.append([bucket, generations, tokens, 1])

    def _history_series(self, now: float) -> dict[str, Any]:
        """Per-bucket rates from the first bucket with work up to now, gaps filled with zeros."""
        out = {"bucket_s": self._bucket_s, "t": [], "generations_per_s": [], "tokens_per_s": []}
        if not self._history:
            return out
        # The bucket in progress is still filling (its rate would read low), so the series ends
        # at the last complete bucket, unless that would leave it empty.
        last = max(int(now // self._bucket_s) - 1, int(self._history[0][0]))
        first = max(int(self._history[0][0]), last - self._history_len + 1)
        filled = {b: (g, t) for b, g, t, _ in self._history}
        to_wall = self._wall() - now  # monotonic → wall offset
        for b in range(first, last + 1):
            g, t = filled.get(b, (0, 0))
            out["t"].append(round((b + 1) * self._bucket_s + to_wall, 3))  # bucket end
            out["generations_per_s"].append(g / self._bucket_s)
            out["tokens_per_s"].append(t / self._bucket_s)
        return out


def _per_s(count: float, seconds: float) -> float:
    """``count / seconds``, with the span floored at 1 s so the first group gives no wild spike."""
    return count / max(seconds, 1.0) if count else 0.0

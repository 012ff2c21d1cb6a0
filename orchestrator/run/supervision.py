"""The managed servers' supervision, wired in one place.

The watchdog (``run.watchdog``) watches each server's progress, the fleet (``run.fleet``)
restarts or retires a server that exited or stalled, and the pool's workers follow their server:
started when it is healthy, stopped while it is down (their groups go to the other servers),
retired with it. :class:`Supervision` builds the two and connects them to the pool and the status
board; the run loop starts it, hands its ``fleet`` and ``watchdog`` to the drive loop, and closes
it.

Without managed servers (``--server-urls``, ``--executor ray``) there is nothing to supervise: the
workers start at once.
"""

from __future__ import annotations

from hallulog.backends.servers import ServerProcess
from hallulog.config.run_config import RunConfig
from hallulog.orchestrator.run.fleet import HEALTHY, ServerFleet
from hallulog.orchestrator.run.status import StatusBoard
from hallulog.orchestrator.run.watchdog import ServerProgress, Watchdog

__all__ = ["Supervision"]


class Supervision:
    """The fleet and the watchdog of ``servers``, wired to ``pool`` and ``board``.

    ``pool`` is a :class:`~hallulog.orchestrator.run.pool.WorkerPool` (or any pool with its
    ``busy``/``workers_of``/``start``/``stop_workers``/``retire_workers``).
    """

    def __init__(
        self, servers: list[ServerProcess], pool, config: RunConfig, board: StatusBoard
    ) -> None:
        self.pool, self.board = pool, board
        self.watchdog: Watchdog | None = None
        self.fleet: ServerFleet | None = None
        self._closed = self._watching = False
        if not servers:
            return
        self.watchdog = Watchdog(
            [s.url for s in servers],
            stall_seconds=config.watchdog_stall_seconds,
            busy=pool.busy,
            on_update=self._seen,
        )
        self.fleet = ServerFleet(
            servers,
            board=board,
            max_restarts=config.server_max_restarts,
            backoff=config.server_restart_backoff,
            on_up=self._up,
            on_down=self._down,
            on_retired=self._retired,
        )

    def start(self) -> None:
        """Start watching and wait for the servers in the background (their workers start as
        each is healthy); without servers, start every worker now."""
        if self.fleet is None:
            self.pool.start()
            self.board.set_phase("running")
            return
        assert self.watchdog is not None
        self.watchdog.start()
        self._watching = True
        self.fleet.start()

    def stop_watching(self) -> None:
        """Stop the watchdog's thread (idempotent)."""
        if self._watching and self.watchdog is not None:
            self._watching = False
            self.watchdog.stop()

    def close(self, timeout: float = 120.0) -> None:
        """Stop watching, cancel restarts not begun and wait (bounded) for those under way;
        the second call is a no-op."""
        if self._closed:
            return
        self._closed = True
        self.stop_watching()
        if self.fleet is not None:
            self.fleet.close(timeout=timeout)

    def healthy_urls(self) -> list[str]:
        return self.fleet.healthy_urls() if self.fleet is not None else []

    # ---- the wiring ----------------------------------------------------------------------

    def _seen(self, seen: ServerProgress) -> None:
        """The watchdog's view on the board, for healthy servers only (a down or retired
        server keeps the fleet's word). Called on the watchdog's thread."""
        if self.fleet is None or self.fleet.state(seen.url) != HEALTHY:
            return
        health = "stalled" if seen.stalled else "healthy" if seen.reachable else "unresponsive"
        self.board.server_update(
            seen.url, health=health, in_flight=None if seen.running is None else int(seen.running)
        )

    def _up(self, url: str) -> None:
        if self.watchdog is not None:
            self.watchdog.reset(url)
        self.pool.start(self.pool.workers_of(url))
        self.board.set_phase("running")

    def _down(self, url: str, why: str) -> None:
        self.pool.stop_workers(self.pool.workers_of(url), f"server {url} down ({why})")

    def _retired(self, url: str, why: str) -> None:
        self.pool.retire_workers(self.pool.workers_of(url), f"server {url} retired ({why})")

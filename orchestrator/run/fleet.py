"""The managed servers' health: restart with exponential backoff, retire the hopeless ones.

A server goes ``starting`` → ``healthy``; when it exits, stalls (the watchdog) or fails to come
up, it is ``down``: its workers are stopped (the pool re-queues their groups for the other
servers) and it is restarted after ``backoff * 2**(failures - 1)`` seconds. ``failures`` counts
failures in a row: it resets once a group completes on the server. A server that fails more than
``max_restarts`` times in a row is ``retired`` (status health ``retired: why``) and its workers
stay down; the run goes on with the others and fails only when no server is left.

Starting and restarting block (readiness polling, up to ``--server-startup-timeout``), so they
run on a small thread pool; the run loop calls :meth:`ServerFleet.poll` about once a second and
never waits on a server.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass

from hallulog.backends.servers import ServerProcess
from hallulog.orchestrator.run.status import StatusBoard

__all__ = ["ServerFleet", "STARTING", "HEALTHY", "DOWN", "RETIRED"]

log = logging.getLogger(__name__)

STARTING, HEALTHY, DOWN, RETIRED = "starting", "healthy", "down", "retired"


@dataclass
class _Entry:
    server: ServerProcess
    state: str = STARTING
    failures: int = 0
    next_try: float = 0.0
    future: Future | None = None
    why: str = ""


class ServerFleet:
    """Supervises already spawned :class:`ServerProcess` objects (``start_servers(wait=False)``).

    Callbacks (run loop thread): ``on_up(url)`` when a server is healthy, ``on_down(url, why)``
    when it failed (stop its workers), ``on_retired(url, why)`` when it is given up.
    """

    def __init__(
        self,
        servers: list[ServerProcess],
        *,
        board: StatusBoard | None,
        max_restarts: int,
        backoff: float,
        on_up: Callable[[str], None],
        on_down: Callable[[str, str], None],
        on_retired: Callable[[str, str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._entries = {s.url: _Entry(s) for s in servers}
        self._board = board
        self.max_restarts = max_restarts
        self.backoff = backoff
        self._on_up, self._on_down, self._on_retired = on_up, on_down, on_retired
        self._clock = clock
        self._threads = ThreadPoolExecutor(
            max_workers=max(1, len(servers)), thread_name_prefix="server-start"
        )

    def start(self) -> None:
        """Wait for every server's readiness in the background; :meth:`poll` reports it."""
        for entry in self._entries.values():
            entry.state = STARTING
            entry.future = self._threads.submit(entry.server.wait_ready)

    def poll(self, stalled: Iterable[str] = ()) -> None:
        """Advance every server's state: notice failures, restarts due, restarts finished."""
        stalled = set(stalled)
        now = self._clock()
        for url, entry in self._entries.items():
            if entry.state == HEALTHY:
                if url in stalled:
                    self._fail(entry, "stalled")
                elif not entry.server.alive():
                    code = entry.server.process.returncode if entry.server.process else None
                    self._fail(entry, f"exited with code {code}")
            elif entry.state == STARTING and entry.future is not None and entry.future.done():
                exc = entry.future.exception()
                entry.future = None
                if exc is not None:
                    self._fail(entry, f"start failed: {str(exc).splitlines()[0]}")
                else:
                    entry.state = HEALTHY
                    log.info("%s healthy (restarts: %d)", entry.server.name, entry.server.restarts)
                    self._update(url, "healthy", restarts=entry.server.restarts)
                    self._on_up(url)
            elif entry.state == DOWN and now >= entry.next_try:
                entry.state = STARTING
                self._update(url, f"restarting ({entry.why})")
                entry.future = self._threads.submit(entry.server.restart)

    def progressed(self, url: str) -> None:
        """A group completed on ``url``: its failure streak ends."""
        entry = self._entries.get(url)
        if entry is not None:
            entry.failures = 0

    def _fail(self, entry: _Entry, why: str) -> None:
        url, name = entry.server.url, entry.server.name
        entry.failures += 1
        entry.why = why
        self._on_down(url, why)
        if entry.failures > self.max_restarts:
            entry.state = RETIRED
            entry.why = f"{why}; failed {entry.failures} time(s) in a row"
            log.error(
                "retiring %s (%s): %s; its prompt groups go to the other servers",
                name,
                url,
                entry.why,
            )
            self._update(url, f"retired: {entry.why}")
            self._threads.submit(entry.server.stop)
            self._on_retired(url, entry.why)
            return
        delay = self.backoff * 2 ** (entry.failures - 1)
        entry.state, entry.next_try = DOWN, self._clock() + delay
        log.error(
            "restarting %s (%s) in %.0f s (failure %d of %d allowed in a row); "
            "re-queuing its in-flight prompt groups",
            name,
            why,
            delay,
            entry.failures,
            self.max_restarts + 1,
        )
        self._update(url, f"down ({why}); restart in {delay:.0f} s")

    def _update(self, url: str, health: str, restarts: int | None = None) -> None:
        if self._board is not None:
            self._board.server_update(url, health=health, restarts=restarts)

    # ---- questions the run loop asks -------------------------------------------------------

    def state(self, url: str) -> str:
        return self._entries[url].state

    def healthy_urls(self) -> list[str]:
        return [url for url, e in self._entries.items() if e.state == HEALTHY]

    def recovering(self) -> bool:
        """Whether some server is starting or waiting for its restart."""
        return any(e.state in (STARTING, DOWN) for e in self._entries.values())

    def all_retired(self) -> bool:
        return all(e.state == RETIRED for e in self._entries.values())

    def retired_reasons(self) -> str:
        return "; ".join(
            f"{e.server.name} ({url}): {e.why}"
            for url, e in self._entries.items()
            if e.state == RETIRED
        )

    def close(self, timeout: float = 120.0) -> None:
        """Cancel restarts not begun and wait (bounded) for those under way, so that no server
        is spawned after its owner stopped it."""
        self._threads.shutdown(wait=False, cancel_futures=True)
        running = [
            e.future for e in self._entries.values() if e.future is not None and not e.future.done()
        ]
        if running:
            log.info("waiting up to %.0f s for %d server start(s) under way", timeout, len(running))
            futures_wait(running, timeout=timeout)

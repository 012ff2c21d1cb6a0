"""Server watchdog: find managed servers that stopped making progress.

A background thread scrapes each server's Prometheus ``/metrics`` (vLLM's names, which the
embedded server also exports). A server is *stalled* when, for ``stall_seconds``, its generated
token counter stays flat while it has work — its own ``num_requests_running`` > 0, or prompt
groups in flight on it as the orchestrator knows them (which also covers a server whose
``/metrics`` does not answer, or whose engine is stopped and whose gauges went stale). The run
loop restarts stalled servers; the thread only observes.

Time comes from an injected ``clock`` (``time.monotonic`` by default) and one round of scrapes is
:meth:`Watchdog.poll`, so a caller can drive the watchdog step by step without the thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Watchdog", "ServerProgress", "parse_progress_metrics"]

log = logging.getLogger(__name__)

TOKENS = "vllm:generation_tokens"
RUNNING = "vllm:num_requests_running"


def parse_progress_metrics(text: str) -> tuple[float | None, float | None]:
    """(generated tokens total, running requests) summed over label sets; None when absent."""
    tokens = running = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (TOKENS, TOKENS + "_total"):
                tokens = (tokens or 0.0) + sample.value
            elif sample.name == RUNNING:
                running = (running or 0.0) + sample.value
    return tokens, running


@dataclass
class ServerProgress:
    """What the watchdog last saw of one server."""

    url: str
    tokens: float | None = None
    running: float | None = None
    reachable: bool = True
    last_progress: float = field(default_factory=time.monotonic)
    stalled: bool = False


class Watchdog:
    """Polls servers every ``interval`` seconds on a daemon thread (:meth:`start`), or once per
    :meth:`poll` call. ``clock`` returns seconds (monotonic); stalls are measured on it."""

    def __init__(
        self,
        urls: list[str],
        *,
        stall_seconds: float,
        busy: Callable[[str], bool],
        interval: float = 2.0,
        on_update: Callable[[ServerProgress], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self.servers = {url: ServerProgress(url, last_progress=clock()) for url in urls}
        self.stall_seconds = stall_seconds
        self.interval = interval
        self.scrape_timeout = min(5.0, interval * 2)
        self._busy = busy
        self._on_update = on_update
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def stalled(self) -> list[str]:
        """URLs currently judged stalled."""
        with self._lock:
            return [s.url for s in self.servers.values() if s.stalled]

    def reset(self, url: str) -> None:
        """Forget a server's history (after its restart)."""
        with self._lock:
            self.servers[url] = ServerProgress(url, last_progress=self._clock())

    def poll(self) -> None:
        """Scrape every server once and update its state (what the thread does each interval)."""
        with httpx.Client(timeout=self.scrape_timeout) as client:
            self._poll(client)

    def _loop(self) -> None:
        with httpx.Client(timeout=self.scrape_timeout) as client:
            while not self._stop.wait(self.interval):
                self._poll(client)

    def _poll(self, client: httpx.Client) -> None:
        for url in list(self.servers):
            self._check(client, url)

    def _check(self, client: httpx.Client, url: str) -> None:
        now = self._clock()
        try:
            tokens, running = parse_progress_metrics(client.get(f"{url}/metrics").text)
            reachable = True
        except (httpx.HTTPError, ValueError):
            tokens, running, reachable = None, None, False
        with self._lock:
            state = self.servers[url]
            progressed = tokens is not None and tokens != state.tokens
            # vLLM's gauges are updated by the engine: a stopped engine leaves them stale (0
            # running), so the orchestrator's own view of in-flight work counts too.
            has_work = (running or 0) > 0 or self._busy(url)
            if progressed or not has_work:
                state.last_progress = now
            state.tokens = tokens if tokens is not None else state.tokens
            state.running, state.reachable = running, reachable
            was = state.stalled
            state.stalled = has_work and now - state.last_progress > self.stall_seconds
            snapshot = ServerProgress(**vars(state))
        if state.stalled and not was:
            log.error(
                "server %s made no progress for %.0f s with work in flight (%s)",
                url,
                now - snapshot.last_progress,
                "metrics unreachable" if not reachable else f"{running:.0f} running",
            )
        if self._on_update is not None:
            self._on_update(snapshot)

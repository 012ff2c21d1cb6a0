"""Prometheus exposition of a status snapshot: one custom collector, read at scrape time.

Names follow Prometheus conventions (``hallulog_`` prefix, ``_total`` on counters, base units).
The collector holds no state of its own: every scrape calls ``get_snapshot`` once and turns that
one consistent snapshot into metric families, so all values of a scrape agree with each other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from hallulog.contracts.run_phases import RUN_PHASES
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    StateSetMetricFamily,
)
from prometheus_client.registry import Collector

__all__ = ["SnapshotCollector", "make_registry", "render", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PHASES = RUN_PHASES


class SnapshotCollector(Collector):
    """Yields the run's counters and gauges from ``get_snapshot()`` at each scrape."""

    def __init__(self, get_snapshot: Callable[[], dict]) -> None:
        self._get_snapshot = get_snapshot

    def collect(self) -> Iterator[Any]:
        yield from families(self._get_snapshot())


def families(snap: dict) -> Iterator[Any]:
    prompts = snap.get("prompts", {})
    rates = snap.get("rates", {})

    yield InfoMetricFamily(
        "hallulog_run",
        "Run identity.",
        value={
            "run_id": str(snap.get("run_id", "")),
            "fingerprint": str(snap.get("fingerprint", "")),
            "artifact_root": str(snap.get("artifact_root", "")),
        },
    )
    phase = snap.get("phase")
    yield StateSetMetricFamily(
        "hallulog_phase", "Current phase of the run.", value={p: p == phase for p in PHASES}
    )

    yield GaugeMetricFamily(
        "hallulog_prompts",
        "Prompts of the run, including skipped ones.",
        value=prompts.get("total", 0),
    )
    yield CounterMetricFamily(
        "hallulog_prompts_done",
        "Prompt groups completed by this process.",
        value=prompts.get("done", 0),
    )
    yield CounterMetricFamily(
        "hallulog_prompts_failed", "Prompts whose group failed.", value=prompts.get("failed", 0)
    )
    yield GaugeMetricFamily(
        "hallulog_prompts_in_flight",
        "Prompt groups being processed.",
        value=prompts.get("in_flight", 0),
    )
    yield GaugeMetricFamily(
        "hallulog_prompts_skipped",
        "Prompts already completed by an earlier run (resume).",
        value=prompts.get("skipped", 0),
    )
    yield GaugeMetricFamily(
        "hallulog_prompts_remaining",
        "Prompts not done, failed or skipped.",
        value=prompts.get("remaining", 0),
    )
    yield GaugeMetricFamily(
        "hallulog_progress_ratio", "(skipped + done) / total.", value=snap.get("progress", 0.0)
    )
    yield CounterMetricFamily(
        "hallulog_generations", "Generations completed.", value=snap.get("generations", 0)
    )
    yield CounterMetricFamily("hallulog_tokens", "Generated tokens.", value=snap.get("tokens", 0))
    yield CounterMetricFamily(
        "hallulog_errors", "Errors reported by workers.", value=snap.get("errors_total", 0)
    )

    for key, name, help_ in (
        ("generations_per_s", "hallulog_generations_per_second", "Generation throughput."),
        ("tokens_per_s", "hallulog_tokens_per_second", "Token throughput."),
        ("prompts_per_s", "hallulog_prompts_per_second", "Prompt group throughput."),
    ):
        g = GaugeMetricFamily(
            name,
            help_ + " window=recent is the sliding window, window=overall the whole run.",
            labels=["window"],
        )
        for window in ("recent", "overall"):
            g.add_metric([window], rates.get(key, {}).get(window, 0.0))
        yield g
    eta = snap.get("eta_s")
    if eta is not None:
        yield GaugeMetricFamily(
            "hallulog_eta_seconds", "Estimated time to finish the prompts.", value=eta
        )
    yield GaugeMetricFamily(
        "hallulog_elapsed_seconds", "Seconds of work so far.", value=snap.get("elapsed_s", 0.0)
    )

    workers = snap.get("workers", [])
    w_done = CounterMetricFamily(
        "hallulog_worker_prompts_done", "Prompt groups done per worker.", labels=["worker"]
    )
    w_err = CounterMetricFamily("hallulog_worker_errors", "Errors per worker.", labels=["worker"])
    w_fly = GaugeMetricFamily(
        "hallulog_worker_in_flight", "Groups in flight per worker.", labels=["worker"]
    )
    w_state = GaugeMetricFamily(
        "hallulog_worker_state", "1 for the worker's current state.", labels=["worker", "state"]
    )
    for w in workers:
        wid = str(w.get("id"))
        w_done.add_metric([wid], w.get("done", 0))
        w_err.add_metric([wid], w.get("errors", 0))
        w_fly.add_metric([wid], w.get("in_flight", 0))
        w_state.add_metric([wid, str(w.get("state", ""))], 1)
    yield from (w_done, w_err, w_fly, w_state)

    servers = snap.get("servers", [])
    s_up = GaugeMetricFamily(
        "hallulog_server_up", "1 when the backend reports healthy.", labels=["url"]
    )
    s_restarts = CounterMetricFamily(
        "hallulog_server_restarts", "Backend restarts.", labels=["url"]
    )
    s_fly = GaugeMetricFamily(
        "hallulog_server_in_flight", "Requests in flight per backend.", labels=["url"]
    )
    for s in servers:
        url = str(s.get("url"))
        s_up.add_metric([url], 1 if s.get("health") in ("ok", "healthy") else 0)
        s_restarts.add_metric([url], s.get("restarts", 0) or 0)
        s_fly.add_metric([url], s.get("in_flight", 0) or 0)
    yield from (s_up, s_restarts, s_fly)


def make_registry(get_snapshot: Callable[[], dict]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(get_snapshot))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The Prometheus text format of one scrape (calls ``get_snapshot`` once)."""
    return generate_latest(registry)

"""The one place the fleet and the watchdog are wired to the pool: workers follow their server
(started when it is healthy, stopped while it is down, retired with it).

Real pool processes and pipes (the fake worker of tests/orchestrator/fake_worker.py) and the
real fleet and watchdog; the servers are test_fleet's stand-ins, whose health the test decides.
"""

from __future__ import annotations

import time
from pathlib import Path

from hallulog.config.run_config import RunConfig
from hallulog.orchestrator.run.fleet import DOWN, HEALTHY, RETIRED
from hallulog.orchestrator.run.pool import WorkerPool
from hallulog.orchestrator.run.status import StatusBoard
from hallulog.orchestrator.run.supervision import Supervision

from tests.orchestrator.fake_worker import FakeSpec, committed, fake_worker
from tests.orchestrator.test_fleet import FakeServer


def _until(check, what: str, timeout: float = 30.0, poll=None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        if poll is not None:
            poll()
        time.sleep(0.02)


def test_workers_follow_their_server(tmp_path: Path):
    a, b = (
        FakeServer("server_0", "http://127.0.0.1:9"),
        FakeServer("server_1", "http://127.0.0.1:10"),
    )
    specs = [
        FakeSpec(i, url, str(tmp_path / f"worker_{i}"))
        for i, url in enumerate([a.url, b.url, a.url])
    ]
    pool = WorkerPool(
        specs, committed_in=lambda wid: set(committed(specs[wid].worker_dir)), target=fake_worker
    )
    board = StatusBoard(
        run_id="r", config_summary={}, fingerprint="f", artifact_root="/x", total_prompts=1
    )
    config = RunConfig(server_max_restarts=0, server_restart_backoff=0.0)
    supervision = Supervision([a, b], pool, config, board)  # type: ignore[list-item]
    try:
        assert supervision.fleet is not None and supervision.watchdog is not None
        supervision.start()
        fleet = supervision.fleet
        _until(
            lambda: fleet.state(a.url) == HEALTHY and fleet.state(b.url) == HEALTHY,
            "both servers healthy",
            poll=fleet.poll,
        )
        assert pool.running() == 3 and board.snapshot()["phase"] == "running"
        a.running = False  # server A exits: its workers (0 and 2) stop, then it is retired
        fleet.poll()
        assert fleet.state(a.url) in (DOWN, RETIRED)
        assert pool.running() == 1 and pool.workers[1].state == "running"
        assert set(pool.retired_reasons()) == {0, 2}
        assert "retired" in pool.retired_reasons()[0] and a.url in pool.retired_reasons()[0]
        assert fleet.state(a.url) == RETIRED and supervision.healthy_urls() == [b.url]
    finally:
        pool.kill()
        supervision.close(timeout=5)
        supervision.close(timeout=5)  # the second call is a no-op


def test_without_servers_every_worker_starts_at_once(tmp_path: Path):
    specs = [FakeSpec(i, "http://remote", str(tmp_path / f"worker_{i}")) for i in range(2)]
    pool = WorkerPool(specs, committed_in=lambda wid: set(), target=fake_worker)
    board = StatusBoard(
        run_id="r", config_summary={}, fingerprint="f", artifact_root="/x", total_prompts=1
    )
    supervision = Supervision([], pool, RunConfig(), board)
    try:
        assert supervision.fleet is None and supervision.watchdog is None
        supervision.start()
        assert pool.running() == 2 and board.snapshot()["phase"] == "running"
        assert supervision.healthy_urls() == []
    finally:
        pool.kill()
        supervision.close()

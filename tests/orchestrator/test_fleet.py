"""Server fleet: restarts with exponential backoff, retirement after failures in a row."""

from __future__ import annotations

import time

from hallulog.orchestrator.run.fleet import DOWN, HEALTHY, RETIRED, STARTING, ServerFleet
from hallulog.orchestrator.run.status import StatusBoard


class FakeServer:
    """Stands in for ServerProcess: ``healthy_after_start`` decides how starts end."""

    def __init__(self, name: str, url: str, starts_ok=(True,)) -> None:
        self.name, self.url = name, url
        self.restarts, self.stops = 0, 0
        self.starts_ok = list(starts_ok)
        self.running = False
        self.process = None

    def wait_ready(self) -> float:
        ok = self.starts_ok.pop(0) if self.starts_ok else True
        if not ok:
            raise RuntimeError(f"server {self.url} exited with code -9 before becoming healthy")
        self.running = True
        return 0.0

    def restart(self) -> None:
        self.stop()
        self.restarts += 1
        self.wait_ready()

    def stop(self) -> None:
        self.stops += 1
        self.running = False

    def alive(self) -> bool:
        return self.running


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _fleet(servers, *, max_restarts=2, backoff=1.0):
    calls = []
    clock = Clock()
    board = StatusBoard(
        run_id="r", config_summary={}, fingerprint="f", artifact_root="/x", total_prompts=1
    )
    fleet = ServerFleet(
        servers,
        board=board,
        max_restarts=max_restarts,
        backoff=backoff,
        on_up=lambda url: calls.append(("up", url)),
        on_down=lambda url, why: calls.append(("down", url)),
        on_retired=lambda url, why: calls.append(("retired", url)),
        clock=clock,
    )
    return fleet, calls, clock, board


def _settle(fleet: ServerFleet, stalled=()) -> None:
    """Poll until no start is under way (the fake starts finish at once on the thread pool)."""
    for _ in range(200):
        fleet.poll(stalled)
        if not any(e.state == STARTING for e in fleet._entries.values()):
            return
        time.sleep(0.01)
    raise AssertionError("a start never finished")


def test_servers_come_up_and_a_dead_one_restarts_after_backoff():
    a, b = FakeServer("server_0", "A"), FakeServer("server_1", "B")
    fleet, calls, clock, board = _fleet([a, b])
    fleet.start()
    _settle(fleet)
    assert sorted(calls) == [("up", "A"), ("up", "B")]
    a.running = False  # exits
    fleet.poll()
    assert fleet.state("A") == DOWN and calls[-1] == ("down", "A")
    clock.t += 0.5
    fleet.poll()
    assert fleet.state("A") == DOWN, "restarted before its backoff"
    clock.t += 0.6
    _settle(fleet)
    assert fleet.state("A") == HEALTHY and calls[-1] == ("up", "A") and a.restarts == 1
    servers = {s["url"]: s for s in board.snapshot()["servers"]}
    assert servers["A"]["health"] == "healthy" and servers["A"]["restarts"] == 1
    fleet.close()


def test_backoff_doubles_and_a_server_failing_in_a_row_is_retired():
    a = FakeServer("server_0", "A", starts_ok=(False, False, False))
    b = FakeServer("server_1", "B")
    fleet, calls, clock, board = _fleet([a, b], max_restarts=2, backoff=1.0)
    fleet.start()
    _settle(fleet)
    delays = []
    while fleet.state("A") != RETIRED:
        assert fleet.state("A") == DOWN
        delays.append(fleet._entries["A"].next_try - clock.t)
        clock.t = fleet._entries["A"].next_try
        _settle(fleet)
    assert delays == [1.0, 2.0]
    assert ("retired", "A") in calls and not fleet.all_retired()
    assert fleet.healthy_urls() == ["B"]
    health = {s["url"]: s["health"] for s in board.snapshot()["servers"]}
    assert health["A"].startswith("retired: start failed") and "3 time(s) in a row" in health["A"]
    assert "server_0 (A): start failed" in fleet.retired_reasons()
    fleet.close()


def test_progress_resets_the_failure_streak():
    a = FakeServer("server_0", "A")
    fleet, calls, clock, _ = _fleet([a], max_restarts=1)
    fleet.start()
    _settle(fleet)
    for _ in range(3):  # dies, restarts fine, completes a group: never retired
        a.running = False
        fleet.poll()
        clock.t += 10
        _settle(fleet)
        assert fleet.state("A") == HEALTHY
        fleet.progressed("A")
    a.running = False
    fleet.poll()
    clock.t += 10
    _settle(fleet)
    a.running = False  # two failures with no progress between: retired (max_restarts=1)
    fleet.poll()
    assert fleet.state("A") == RETIRED and fleet.all_retired()
    fleet.close()


def test_stalled_server_is_taken_down():
    a = FakeServer("server_0", "A")
    fleet, calls, clock, _ = _fleet([a])
    fleet.start()
    _settle(fleet)
    fleet.poll(stalled=["A"])
    assert fleet.state("A") == DOWN and calls[-1] == ("down", "A")
    assert fleet.recovering()
    fleet.close()

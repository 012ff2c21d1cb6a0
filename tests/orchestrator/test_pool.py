"""The worker pool with a tiny fake worker: dispatch by free slot, deaths, hangs, retirement.

Real spawned processes and real pipes; only the work is fake (tests/orchestrator/fake_worker.py).
"""

from __future__ import annotations

import collections
import os
import random
import signal
import time
from pathlib import Path

import pytest
from hallulog.contracts.prompt_group import PromptGroup
from hallulog.orchestrator.run.pool import WorkerPool

from tests.orchestrator.fake_worker import FakeSpec, committed, fake_worker


def _groups(n: int, **meta) -> list[PromptGroup]:
    return [
        PromptGroup.create("t", "dev", i, [{"role": "user", "content": f"q{i}"}], meta=meta)
        for i in range(n)
    ]


def _pool(tmp_path: Path, urls: list[str], slots: int = 2, **kw) -> WorkerPool:
    specs = [FakeSpec(i, url, str(tmp_path / f"worker_{i}"), slots) for i, url in enumerate(urls)]
    return WorkerPool(
        specs,
        committed_in=lambda wid: set(committed(specs[wid].worker_dir)),
        target=fake_worker,
        **kw,
    )


def _drain(pool: WorkerPool, timeout: float = 60.0, on_events=None) -> list[dict]:
    seen = []
    deadline = time.monotonic() + timeout
    while pool.remaining:
        assert time.monotonic() < deadline, f"stuck waiting for {pool.describe_wait()}"
        events = pool.next_events(0.2)
        for w in pool.workers.values():
            assert len(w.in_flight) <= w.spec.groups_in_flight
        pool.kill_hung()
        seen += events
        if on_events:
            on_events(events)
    return seen


def _resolved(events) -> collections.Counter:
    return collections.Counter(
        e["prompt_id"] for e in events if e["event"] in ("done", "failed", "recovered")
    )


def _all_committed(tmp_path: Path) -> collections.Counter:
    return collections.Counter(pid for d in tmp_path.glob("worker_*") for pid in committed(d))


def test_groups_go_to_free_slots_and_a_slow_server_gets_fewer(tmp_path):
    pool = _pool(tmp_path, ["fake://fast", "fake://slow"])
    pool.start()
    groups = _groups(40)
    pool.submit(groups)
    try:
        events = _drain(pool)
    finally:
        pool.close()
    assert _resolved(events) == {g.prompt_id: 1 for g in groups}
    per_worker = collections.Counter(e["worker_id"] for e in events if e["event"] == "done")
    assert per_worker[0] > per_worker[1] >= 2, per_worker
    assert pool.server_load == {"fake://fast": 0, "fake://slow": 0}


def test_worker_killed_while_blocked_in_receive_is_replaced(tmp_path):
    """The bug this pool fixes: a worker SIGKILLed inside the channel's receive."""
    pool = _pool(tmp_path, ["fake://fast"])
    pool.start()
    try:
        deadline = time.monotonic() + 30
        while not pool.workers[0].ready:  # it says "ready", then blocks in conn.recv()
            assert time.monotonic() < deadline, "the worker never said ready"
            pool.next_events(0.2)
        first = pool.workers[0].proc
        os.kill(first.pid, signal.SIGKILL)
        groups = _groups(6)
        pool.submit(groups)
        events = _drain(pool, timeout=30)
    finally:
        pool.close()
    assert pool.workers[0].generation == 2
    assert [e for e in events if e["event"] == "worker_died"][0]["exitcode"] == -signal.SIGKILL
    assert _resolved(events) == {g.prompt_id: 1 for g in groups}


def test_random_sigkills_lose_and_double_nothing(tmp_path):
    pool = _pool(tmp_path, ["fake://fast", "fake://fast"], slots=3, max_restarts=100)
    pool.start()
    groups = _groups(60, sleep=0.05)
    pool.submit(groups)
    rng = random.Random(7)
    kills = []

    def killer(events):
        if len(kills) < 6 and rng.random() < 0.3:
            w = pool.workers[rng.choice([0, 1])]
            if w.proc is not None and w.proc.is_alive():
                os.kill(w.proc.pid, signal.SIGKILL)
                kills.append(w.proc.pid)

    try:
        events = _drain(pool, timeout=90, on_events=killer)
    finally:
        pool.close()
    assert len(kills) >= 3
    assert _resolved(events) == {g.prompt_id: 1 for g in groups}
    assert _all_committed(tmp_path) == {g.prompt_id: 1 for g in groups}


def test_group_committed_by_a_worker_that_then_died_is_recovered_not_redone(tmp_path):
    pool = _pool(tmp_path, ["fake://fast"])
    pool.start()
    group = PromptGroup.create("t", "dev", "x", [], meta={"commit_then_die": True})
    pool.submit([group])
    try:
        events = _drain(pool, timeout=30)
    finally:
        pool.close()
    assert [
        e["event"]
        for e in events
        if e["prompt_id" if "prompt_id" in e else "event"] == group.prompt_id
    ] == ["dispatched", "recovered"]
    assert committed(tmp_path / "worker_0") == [group.prompt_id]


def test_hung_worker_is_killed_after_the_deadline_and_its_group_redone(tmp_path):
    pool = _pool(tmp_path, ["fake://fast"], hang_seconds=1.0)
    pool.start()
    groups = _groups(3, hang_once=str(tmp_path / "hung"))
    pool.submit(groups)
    try:
        events = _drain(pool, timeout=30)
    finally:
        pool.close()
    assert any(e["event"] == "worker_died" for e in events)
    assert _resolved(events) == {g.prompt_id: 1 for g in groups}


@pytest.mark.slow
def test_worker_that_keeps_dying_is_retired_and_others_take_its_groups(tmp_path):
    pool = _pool(tmp_path, ["fake://doomed", "fake://fast"], max_restarts=1)
    pool.start()
    groups = _groups(20, sleep=0.5)
    pool.submit(groups)
    try:
        events = _drain(pool, timeout=60)
    finally:
        pool.close()
    retired = [e for e in events if e["event"] == "worker_retired"]
    assert [e["worker_id"] for e in retired] == [0]
    assert pool.running() == 1 and 0 in pool.retired_reasons()
    assert _resolved(events) == {g.prompt_id: 1 for g in groups}


def test_stopped_workers_hand_their_groups_to_the_others_until_started_again(tmp_path):
    pool = _pool(tmp_path, ["fake://slow", "fake://fast"])
    pool.start()
    groups = _groups(10, sleep=0.2)
    pool.submit(groups)
    try:
        while not pool.workers[0].in_flight:
            pool.next_events(0.1)
        pool.stop_workers([0], "server down")
        assert pool.running() == 1 and pool.server_load["fake://slow"] == 0
        events = _drain(pool, timeout=30)
        assert {e["worker_id"] for e in events if e["event"] == "done"} == {1}
        pool.start([0])
        pool.submit(_groups(1, sleep=0.5))  # re-used id: a redo
        _drain(pool, timeout=30)
    finally:
        pool.close()
    assert pool.running() == 2


def test_failed_groups_resolve_and_free_their_slot(tmp_path):
    pool = _pool(tmp_path, ["fake://fast"], slots=1)
    pool.start()
    groups = _groups(4, fail=True)
    pool.submit(groups)
    try:
        events = _drain(pool, timeout=30)
    finally:
        pool.close()
    assert [e["event"] for e in events if e["event"] in ("done", "failed")] == ["failed"] * 4


@pytest.mark.parametrize("n", [1])
def test_close_is_bounded_even_with_a_stuck_worker(tmp_path, n):
    pool = _pool(tmp_path, ["fake://fast"] * n)
    pool.start()
    pool.submit(_groups(1, hang_once=str(tmp_path / "stuck")))
    pool.next_events(0.5)
    started = time.monotonic()
    pool.close(timeout=1.0)
    assert time.monotonic() - started < 15


def test_few_groups_spread_over_the_workers(tmp_path):
    pool = _pool(tmp_path, ["fake://a", "fake://b", "fake://c"], slots=4)
    groups = _groups(3, sleep=0.5)
    pool.submit(groups)
    pool.start()
    try:
        assert [len(w.in_flight) for w in pool.workers.values()] == [1, 1, 1]
        assert pool.server_load == {"fake://a": 1, "fake://b": 1, "fake://c": 1}
        assert not pool.busy("fake://a"), "busy before the worker is up"
        deadline = time.monotonic() + 30
        while not pool.workers[0].ready and time.monotonic() < deadline:
            pool.next_events(0.1)
        assert pool.busy("fake://a") or not pool.workers[0].in_flight
        _drain(pool, timeout=30)
        assert not pool.busy("fake://a")
    finally:
        pool.close()


def test_a_submitted_iterator_is_pulled_one_group_per_free_slot(tmp_path):
    """A run streams its task: the pool takes a group only when a slot frees up."""
    pool = _pool(tmp_path, ["fake://fast", "fake://fast"], slots=2)
    groups = _groups(30)
    pulled: list[str] = []

    def source():
        for g in groups:
            pulled.append(g.prompt_id)
            yield g

    pool.submit(source(), count=len(groups))
    assert pulled == [] and pool.remaining == 30  # nothing taken before a slot is free
    pool.start()
    assert len(pulled) == 4 and pool.remaining == 30  # 2 workers x 2 slots

    def held_at_most_the_slots(_events) -> None:
        assert len(pool.outstanding) <= 4  # groups held: those in flight, never the task

    try:
        events = _drain(pool, on_events=held_at_most_the_slots)
    finally:
        pool.close()
    assert _resolved(events) == {g.prompt_id: 1 for g in groups}
    assert pulled == [g.prompt_id for g in groups]

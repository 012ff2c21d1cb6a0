"""StatusBoard: snapshot fields, counts, rates, ETA, errors, thread safety."""

from __future__ import annotations

import json
import threading

import pytest

from tests.api.status_fixtures import make_board


def test_snapshot_fields_at_start(board):
    s = board.snapshot()
    json.dumps(s)  # JSON-able
    for key in (
        "version",
        "run_id",
        "config",
        "fingerprint",
        "artifact_root",
        "k_samples",
        "phase",
        "started_at",
        "updated_at",
        "now",
        "elapsed_s",
        "prompts",
        "progress",
        "generations",
        "tokens",
        "errors_total",
        "rates",
        "eta_s",
        "workers",
        "servers",
        "errors",
        "history",
    ):
        assert key in s, key
    assert s["phase"] == "starting"
    assert s["prompts"] == {
        "total": 20,
        "done": 0,
        "failed": 0,
        "in_flight": 0,
        "skipped": 4,
        "remaining": 16,
    }
    assert s["progress"] == pytest.approx(4 / 20)
    assert s["rates"]["generations_per_s"] == {"recent": 0.0, "overall": 0.0}
    assert s["eta_s"] is None
    assert s["config"] == {"model": "smollm2-135m", "k_samples": 2}


def test_counts_workers_and_servers(board, clock):
    board.set_phase("running")
    board.worker_update(0, state="generating")
    board.group_started(0, "a")
    board.group_started(0, "b")
    board.group_started(1, "c")
    s = board.snapshot()
    assert s["prompts"]["in_flight"] == 3
    w0 = s["workers"][0]
    assert (w0["id"], w0["state"], w0["current_prompt"], w0["in_flight"]) == (
        0,
        "generating",
        "b",
        2,
    )
    board.worker_update(0, state="capturing", current_prompt="a")
    assert board.snapshot()["workers"][0]["current_prompt"] == "a"

    clock.advance(2)
    board.group_done(0, "a", generations=3, tokens=60)
    board.group_failed(
        1,
        "c",
        {
            "error_type": "ReadTimeout",
            "error_message": "timed out",
            "timestamp": "2026-01-01T00:00:00Z",
            "stack_trace": "long...",
        },
    )
    board.server_update("http://127.0.0.1:8001", health="ok", restarts=1, in_flight=4)
    board.server_update("http://127.0.0.1:8001", health="down")
    s = board.snapshot()
    assert s["prompts"] == {
        "total": 20,
        "done": 1,
        "failed": 1,
        "in_flight": 1,
        "skipped": 4,
        "remaining": 14,
    }
    assert s["workers"][0]["current_prompt"] == "b"  # "a" finished: falls back to in-flight "b"
    assert [(w["done"], w["errors"]) for w in s["workers"]] == [(1, 0), (0, 1)]
    assert s["servers"] == [
        {
            "url": "http://127.0.0.1:8001",
            "health": "down",
            "restarts": 1,
            "in_flight": 4,
            "updated_at": s["servers"][0]["updated_at"],
        }
    ]
    err = s["errors"][0]
    assert (err["error_type"], err["worker_id"], err["prompt_id"]) == ("ReadTimeout", 1, "c")
    assert "stack_trace" not in err
    assert s["generations"] == 3 and s["tokens"] == 60 and s["errors_total"] == 1

    # A failed prompt that is retried and then succeeds is done, not failed.
    board.group_started(0, "c")
    board.group_done(0, "c", generations=3, tokens=30)
    s = board.snapshot()
    assert (s["prompts"]["done"], s["prompts"]["failed"]) == (2, 0)
    # Reporting the same prompt done twice does not count it twice.
    board.group_done(0, "c", generations=0, tokens=0)
    assert board.snapshot()["prompts"]["done"] == 2


def test_rates_window_and_eta(clock):
    board = make_board(clock, total_prompts=200, skipped=4)
    board.set_phase("running")
    board.group_started(0, "p0")
    for i in range(10):  # one group of 3 generations / 100 tokens every 2 s for 20 s
        clock.advance(2)
        board.group_done(0, f"p{i}", generations=3, tokens=100)
        board.group_started(0, f"p{i + 1}")
    s = board.snapshot()
    r = s["rates"]
    assert s["elapsed_s"] == pytest.approx(20)
    assert r["generations_per_s"]["overall"] == pytest.approx(30 / 20)
    assert r["generations_per_s"]["recent"] == pytest.approx(30 / 20)  # window not yet full
    assert r["tokens_per_s"]["recent"] == pytest.approx(1000 / 20)
    assert r["prompts_per_s"]["recent"] == pytest.approx(0.5)
    assert s["eta_s"] == pytest.approx((200 - 4 - 10) / 0.5)

    # Faster for 60 s: the recent window forgets the slow start, overall does not.
    for i in range(10, 70):
        clock.advance(1)
        board.group_done(0, f"p{i}", generations=3, tokens=100)
    s = board.snapshot()
    assert s["rates"]["generations_per_s"]["recent"] == pytest.approx(3.0)
    assert s["rates"]["generations_per_s"]["overall"] == pytest.approx(210 / 80)

    # Idle: the recent rate decays to zero, and with it the ETA becomes unknown.
    clock.advance(120)
    s = board.snapshot()
    assert s["rates"]["generations_per_s"]["recent"] == 0.0
    assert s["eta_s"] is None
    # The overall clock stops when the phase leaves "running".
    board.set_phase("consolidating")
    e1 = board.snapshot()["elapsed_s"]
    clock.advance(30)
    assert board.snapshot()["elapsed_s"] == e1


def test_eta_zero_when_nothing_remains(clock):
    board = make_board(clock, total_prompts=3, skipped=1)
    board.set_phase("running")
    for p in ("a", "b"):
        board.group_started(0, p)
        clock.advance(1)
        board.group_done(0, p, generations=1, tokens=5)
    s = board.snapshot()
    assert s["prompts"]["remaining"] == 0 and s["eta_s"] == 0.0 and s["progress"] == 1.0


def test_history_series(clock):
    board = make_board(clock, history_bucket_s=5.0)
    board.set_phase("running")
    board.group_started(0, "x")
    for i in range(6):  # 2 groups in [0, 5), none in [5, 10), ...
        board.group_done(0, f"g{i}", generations=5, tokens=50)
        clock.advance(2.5 if i % 2 == 0 else 7.5)
    h = board.snapshot()["history"]
    assert h["bucket_s"] == 5.0
    assert len(h["t"]) == len(h["generations_per_s"]) == len(h["tokens_per_s"])
    assert h["generations_per_s"][:2] == [2.0, 0.0]  # 10 generations in the first 5 s bucket
    assert sum(h["generations_per_s"]) * 5 == 30


def test_last_errors_bounded(clock):
    board = make_board(clock, max_errors=3)
    for i in range(5):
        board.group_failed(0, f"p{i}", {"error_type": "E", "error_message": str(i)})
    s = board.snapshot()
    assert [e["error_message"] for e in s["errors"]] == ["2", "3", "4"]
    assert s["errors_total"] == 5 and s["prompts"]["failed"] == 5


def test_bad_arguments(board):
    with pytest.raises(ValueError, match="unknown phase"):
        board.set_phase("sleeping")
    with pytest.raises(ValueError, match="skipped"):
        make_board(total_prompts=2, skipped=3)


def test_concurrent_updates_and_snapshots():
    board = make_board(total_prompts=4000, skipped=0)
    board.set_phase("running")
    errors = []

    def work(w):
        for i in range(500):
            pid = f"{w}-{i}"
            board.group_started(w, pid)
            board.group_done(w, pid, generations=3, tokens=10)

    def read():
        try:
            for _ in range(200):
                s = board.snapshot()
                p = s["prompts"]
                assert p["done"] + p["in_flight"] <= 4000
                json.dumps(s)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    threads.append(threading.Thread(target=read))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    s = board.snapshot()
    assert (
        s["prompts"]["done"] == 2000 and s["generations"] == 6000 and s["prompts"]["in_flight"] == 0
    )

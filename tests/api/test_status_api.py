"""The status app: /status, /metrics, /events, auth, the loopback rule, and that /status never
waits on the run loop's checkpoint lock."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient
from hallulog.api import StatusServer, create_app
from prometheus_client.parser import text_string_to_metric_families

from tests.api.status_fixtures import make_board

TOKEN = "t0k3n-for-tests"


@pytest.fixture
def busy_board(clock):
    board = make_board(clock)
    board.set_phase("running")
    board.server_update("http://127.0.0.1:8001", health="ok", restarts=2, in_flight=3)
    for i in range(3):
        board.group_started(i % 2, f"p{i}")
        clock.advance(1)
        board.group_done(i % 2, f"p{i}", generations=3, tokens=50)
    board.group_started(1, "p9")
    board.group_failed(0, "p8", {"error_type": "ServerError", "error_message": "500 from backend"})
    return board


def test_status_json(busy_board):
    client = TestClient(create_app(busy_board.snapshot, None))
    r = client.get("/status")
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    s = r.json()
    assert s["run_id"] == "run-1" and s["phase"] == "running"
    assert s["prompts"] == {
        "total": 20,
        "done": 3,
        "failed": 1,
        "in_flight": 1,
        "skipped": 4,
        "remaining": 12,
    }
    assert s["servers"][0]["restarts"] == 2
    assert s["errors"][0]["error_type"] == "ServerError"
    assert s["rates"]["generations_per_s"]["overall"] == pytest.approx(9 / 3)


def test_metrics_parse(busy_board):
    client = TestClient(create_app(busy_board.snapshot, None))
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert samples[("hallulog_prompts", ())] == 20
    assert samples[("hallulog_prompts_done_total", ())] == 3
    assert samples[("hallulog_prompts_failed_total", ())] == 1
    assert samples[("hallulog_prompts_in_flight", ())] == 1
    assert samples[("hallulog_prompts_skipped", ())] == 4
    assert samples[("hallulog_generations_total", ())] == 9
    assert samples[("hallulog_tokens_total", ())] == 150
    assert samples[("hallulog_generations_per_second", (("window", "overall"),))] == pytest.approx(
        3
    )
    assert ("hallulog_tokens_per_second", (("window", "recent"),)) in samples
    assert samples[("hallulog_phase", (("hallulog_phase", "running"),))] == 1
    assert samples[("hallulog_phase", (("hallulog_phase", "done"),))] == 0
    assert samples[("hallulog_worker_prompts_done_total", (("worker", "1"),))] == 1
    assert samples[("hallulog_worker_errors_total", (("worker", "0"),))] == 1
    assert samples[("hallulog_server_up", (("url", "http://127.0.0.1:8001"),))] == 1
    assert samples[("hallulog_server_restarts_total", (("url", "http://127.0.0.1:8001"),))] == 2
    assert samples[("hallulog_eta_seconds", ())] > 0
    info = [k for k in samples if k[0] == "hallulog_run_info"]
    assert dict(info[0][1])["run_id"] == "run-1"


def test_dashboard_is_self_contained(busy_board):
    client = TestClient(create_app(busy_board.snapshot, None))
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    assert 'fetch("events"' in html and 'id="done"' in html
    for external in ("http://", "https://", "//cdn", "<link"):
        assert external not in html.replace('"http://www.w3.org/2000/svg"', ""), external


def test_token_required_everywhere(busy_board):
    client = TestClient(create_app(busy_board.snapshot, TOKEN))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for path in ("/status", "/metrics", "/events?max=1"):
        r = client.get(path)
        assert r.status_code == 401, path
        assert r.headers["www-authenticate"] == "Bearer"
        err = r.json()["error"]
        assert err["type"] == "authentication_error" and err["code"] == 401
        assert "Bearer" in err["message"]
        assert client.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get(path, headers=auth).status_code == 200, path
        # header only: a token in the URL ends up in logs and browser history
        sep = "&" if "?" in path else "?"
        assert client.get(f"{path}{sep}token={TOKEN}").status_code == 401, path
    # The page is static HTML without run data; it reads #token= and sends the header itself.
    page = client.get("/")
    assert page.status_code == 200 and "Authorization" in page.text
    assert TOKEN not in page.text


def test_error_envelope_for_unknown_path(busy_board):
    r = TestClient(create_app(busy_board.snapshot, None)).get("/nope")
    assert r.status_code == 404
    assert r.json() == {"error": {"message": "Not Found", "type": "not_found_error", "code": 404}}


def test_off_loopback_needs_token(busy_board):
    for host in ("0.0.0.0", "::", "10.1.2.3", "node17.cluster"):
        with pytest.raises(ValueError, match="--status-token"):
            StatusServer(busy_board.snapshot, host=host, port=0, token=None)
        with pytest.raises(ValueError, match="--status-token"):
            StatusServer(busy_board.snapshot, host=host, port=0, token="")
    StatusServer(busy_board.snapshot, host="0.0.0.0", port=0, token=TOKEN)  # allowed, not started
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        StatusServer(busy_board.snapshot, host=host, port=0, token=None)


def _read_sse(lines, n):
    """The next ``n`` events' JSON payloads from an iterator over SSE lines."""
    events, data = [], []
    for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].strip())
        elif line == "" and data:
            events.append(json.loads("\n".join(data)))
            data = []
            if len(events) == n:
                break
    return events


def test_events_stream_snapshots(busy_board):
    with StatusServer(busy_board.snapshot, token=TOKEN, events_interval_s=0.1) as srv:
        with httpx.stream(
            "GET", srv.url + "/events", timeout=5, headers={"Authorization": f"Bearer {TOKEN}"}
        ) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            lines = resp.iter_lines()
            first = _read_sse(lines, 1)[0]
            busy_board.group_done(1, "p9", generations=3, tokens=40)
            later = _read_sse(lines, 2)
        assert first["prompts"]["done"] == 3
        assert later[-1]["prompts"]["done"] == 4
        # ?max= ends the stream by itself
        r = httpx.get(
            srv.url + "/events?max=2", timeout=5, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert r.text.count("data: ") == 2


def test_stop_ends_open_event_streams(busy_board):
    srv = StatusServer(busy_board.snapshot, events_interval_s=0.2).start()
    got_first = threading.Event()
    finished = []

    def listen():
        with httpx.stream("GET", srv.url + "/events", timeout=10) as resp:
            for line in resp.iter_lines():
                if line.startswith("data:"):
                    got_first.set()
        finished.append(True)

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    assert got_first.wait(5)
    t0 = time.monotonic()
    srv.stop()
    t.join(5)
    assert finished and time.monotonic() - t0 < 3


def test_port_in_use_is_a_clear_error(busy_board):
    with StatusServer(busy_board.snapshot) as first:
        with pytest.raises(OSError, match="--status-port"):
            StatusServer(busy_board.snapshot, port=first.port).start()


@contextlib.contextmanager
def _checkpoint_thread_at_lock():
    """An event set when the ``checkpoint`` thread tries to take a file lock (filelock logs
    each attempt at DEBUG before it waits)."""
    at_lock = threading.Event()

    class Attempts(logging.Handler):
        def emit(self, record):
            if record.threadName == "checkpoint" and "acquire" in record.getMessage():
                at_lock.set()

    logger, handler = logging.getLogger("filelock"), Attempts(logging.DEBUG)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield at_lock
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _status_timings_while_checkpoint_blocked(tmp_path, snapshot_of):
    """The run loop's arrangement with the real pieces: a group is reported done on the board
    and a checkpoint is requested from the real ``CheckpointWriter``, whose background write is
    stuck behind the checkpoint file lock (a slow fsync of another writer). Returns the time
    each route takes meanwhile (a timed-out request counts as 5 s)."""
    filelock = pytest.importorskip("filelock")
    from hallulog.orchestrator.run.checkpoint import CHECKPOINT_NAME, CheckpointWriter

    board = make_board()
    board.set_phase("running")
    lock_path = str(tmp_path / CHECKPOINT_NAME) + ".lock"
    slow_fsync = filelock.FileLock(lock_path)
    slow_fsync.acquire()
    writer = CheckpointWriter(tmp_path, "run-1")
    try:
        board.group_started(0, "p1")
        board.group_done(0, "p1", generations=3, tokens=42)
        with _checkpoint_thread_at_lock() as at_lock:
            writer.request({"p1"})
            assert at_lock.wait(5), "the checkpoint writer never reached its file lock"
        assert not (tmp_path / CHECKPOINT_NAME).exists()  # the writer really is blocked
        timings = {}
        with (
            StatusServer(snapshot_of(board, lock_path), events_interval_s=0.1) as srv,
            httpx.Client(base_url=srv.url, timeout=2) as client,
        ):
            for path in ("/status", "/metrics", "/events?max=1"):
                t0 = time.perf_counter()
                try:
                    r = client.get(path)
                    assert r.status_code == 200, path
                    timings[path] = time.perf_counter() - t0
                except httpx.TimeoutException:
                    timings[path] = 5.0
            done = (
                client.get("/status").json()["prompts"]["done"] if timings["/status"] < 5 else None
            )
        assert not (tmp_path / CHECKPOINT_NAME).exists()  # still blocked throughout
        return timings, done
    finally:
        slow_fsync.release()
        writer.close()


def test_checkpoint_lock_does_not_delay_status(tmp_path):
    """/status, /metrics and /events answer at once while the checkpoint is stuck on its lock,
    and already show the group."""
    timings, done = _status_timings_while_checkpoint_blocked(
        tmp_path, lambda board, lock_path: board.snapshot
    )
    assert max(timings.values()) < 0.5, timings
    assert done == 1


def test_checkpoint_lock_test_can_fail(tmp_path):
    """Negative control: a snapshot that waited on the checkpoint lock (e.g. one reading
    completed_prompts.json under it) is caught by the same measurement."""
    import filelock

    def locking_snapshot(board, lock_path):
        def snap():
            with filelock.FileLock(lock_path, timeout=1.5):
                return board.snapshot()

        return snap

    with pytest.raises((AssertionError, filelock.Timeout, httpx.HTTPError)):
        timings, _ = _status_timings_while_checkpoint_blocked(tmp_path, locking_snapshot)
        assert max(timings.values()) < 0.5, timings

"""The watchdog flags a server whose token counter is flat while it has work."""

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hallulog.orchestrator.run.watchdog import Watchdog, parse_progress_metrics

METRICS = """# HELP vllm:generation_tokens_total Generated tokens.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{model_name="a"}} {tokens}
vllm:generation_tokens_total{{model_name="b"}} 1.0
# HELP vllm:num_requests_running Running requests.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="a"}} {running}
"""


def test_parse_sums_label_sets():
    assert parse_progress_metrics(METRICS.format(tokens=41, running=3)) == (42.0, 3.0)
    assert parse_progress_metrics("") == (None, None)


class _Metrics(BaseHTTPRequestHandler):
    state = {"tokens": 0, "running": 0, "hang": False}
    release = threading.Event()  # a hung scrape answers once this is set (fixture teardown)

    def do_GET(self):  # noqa: N802
        if self.state["hang"]:
            self.release.wait(10)
        body = METRICS.format(**{k: v for k, v in self.state.items() if k != "hang"}).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the watchdog gave up on a hung scrape

    def log_message(self, *args):
        pass


@pytest.fixture
def metrics_url():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    _Metrics.state.update(tokens=0, running=0, hang=False)
    _Metrics.release.clear()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    _Metrics.release.set()
    httpd.shutdown()


class ManualClock:
    """The watchdog's clock, moved by the test: stall times are exact, nothing waits."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _wait(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_flat_counter_with_running_requests_is_a_stall(metrics_url):
    clock, seen = ManualClock(), []
    dog = Watchdog(
        [metrics_url],
        stall_seconds=0.5,
        busy=lambda url: False,
        interval=0.1,
        on_update=seen.append,
        clock=clock,
    )
    _Metrics.state.update(running=0)
    dog.poll()
    clock.advance(60)
    dog.poll()
    assert dog.stalled() == [], "idle is not stalled"
    _Metrics.state.update(running=2)
    for i in range(1, 9):  # progressing, each step longer than stall_seconds
        _Metrics.state["tokens"] = i
        clock.advance(1.0)
        dog.poll()
        assert dog.stalled() == []
    clock.advance(0.4)  # flat with 2 running, not yet stall_seconds
    dog.poll()
    assert dog.stalled() == []
    clock.advance(0.2)
    dog.poll()
    assert dog.stalled() == [metrics_url]
    assert (seen[-1].stalled, seen[-1].tokens, seen[-1].running) == (True, 9.0, 2.0)
    dog.reset(metrics_url)
    assert dog.stalled() == []
    dog.poll()
    assert dog.stalled() == [], "the restart's history starts at the reset"


def test_unreachable_server_with_work_in_flight_is_a_stall(metrics_url):
    clock, seen, busy = ManualClock(), [], {"value": False}
    dog = Watchdog(
        [metrics_url],
        stall_seconds=0.5,
        busy=lambda url: busy["value"],
        interval=0.1,
        on_update=seen.append,
        clock=clock,
    )
    _Metrics.state["hang"] = True  # like a SIGSTOPped server: /metrics never answers
    dog.poll()
    clock.advance(60)
    dog.poll()
    assert dog.stalled() == [], "no work in flight: not stalled"
    assert seen[-1].reachable is False
    busy["value"] = True
    clock.advance(0.4)
    dog.poll()
    assert dog.stalled() == []
    clock.advance(0.2)
    dog.poll()
    assert dog.stalled() == [metrics_url]
    assert (seen[-1].reachable, seen[-1].stalled) == (False, True)


def test_stale_gauges_with_work_in_flight_is_a_stall(metrics_url):
    """A stopped vLLM engine leaves num_requests_running at 0 while requests hang."""
    dog = Watchdog([metrics_url], stall_seconds=0.5, busy=lambda url: True, interval=0.1).start()
    try:
        _Metrics.state.update(running=0, tokens=24)
        assert _wait(lambda: dog.stalled() == [metrics_url])
    finally:
        dog.stop()

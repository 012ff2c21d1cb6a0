"""The watchdog flags a server whose token counter is flat while it has work."""

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orchestrator.run.watchdog import Watchdog, parse_progress_metrics

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

    def do_GET(self):  # noqa: N802
        if self.state["hang"]:
            time.sleep(3)
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
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _wait(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_flat_counter_with_running_requests_is_a_stall(metrics_url):
    dog = Watchdog([metrics_url], stall_seconds=0.5, busy=lambda url: False,
                   interval=0.1).start()
    try:
        _Metrics.state.update(running=0)
        time.sleep(0.8)
        assert dog.stalled() == [], "idle is not stalled"
        _Metrics.state.update(running=2)
        for i in range(8):  # progressing
            _Metrics.state["tokens"] = i
            time.sleep(0.1)
        assert dog.stalled() == []
        assert _wait(lambda: dog.stalled() == [metrics_url])  # flat with 2 running
        dog.reset(metrics_url)
        assert dog.stalled() == []
    finally:
        dog.stop()


def test_unreachable_server_with_work_in_flight_is_a_stall(metrics_url):
    busy = {"value": False}
    dog = Watchdog([metrics_url], stall_seconds=0.5, busy=lambda url: busy["value"],
                   interval=0.1).start()
    try:
        _Metrics.state["hang"] = True  # like a SIGSTOPped server: /metrics never answers
        time.sleep(1.0)
        assert dog.stalled() == [], "no work in flight: not stalled"
        busy["value"] = True
        assert _wait(lambda: dog.stalled() == [metrics_url], timeout=8)
    finally:
        _Metrics.state["hang"] = False
        dog.stop()


def test_stale_gauges_with_work_in_flight_is_a_stall(metrics_url):
    """A stopped vLLM engine leaves num_requests_running at 0 while requests hang."""
    dog = Watchdog([metrics_url], stall_seconds=0.5, busy=lambda url: True,
                   interval=0.1).start()
    try:
        _Metrics.state.update(running=0, tokens=24)
        assert _wait(lambda: dog.stalled() == [metrics_url])
    finally:
        dog.stop()

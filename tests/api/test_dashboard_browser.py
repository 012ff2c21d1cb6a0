"""The dashboard in a real headless Chromium: the done count rises live; a screenshot is saved.

The browser part lives in dashboard_browser.py (Selenium with Debian's chromium-driver,
``watch_dashboard(url, ...)``) so it can also be pointed at a real
``python -m orchestrator run --status-port P``. Screenshots go to
``$HALLULOG_SCREENSHOT_DIR`` when set, else to the test's tmp dir; the path is printed.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from hallulog.api import StatusServer

from tests.api.dashboard_browser import missing_browser, watch_dashboard
from tests.api.status_fixtures import make_board

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(missing_browser() is not None, reason=str(missing_browser())),
]


def _feed(board, stop: threading.Event) -> None:
    """A fake run loop: two workers, a group done every 0.25 s, some failures."""
    i = 0
    while not stop.is_set() and i < 36:
        w, pid = i % 2, f"{i:016x}"
        board.group_started(w, pid)
        board.worker_update(w, state="generating")
        time.sleep(0.25)
        if i % 9 == 4:
            board.group_failed(
                w,
                pid,
                {
                    "error_type": "ReadTimeout",
                    "timestamp": time.time(),
                    "error_message": "<script>not run</script> timed out",
                },
            )
        else:
            board.group_done(w, pid, generations=3, tokens=80 + 5 * (i % 7))
        i += 1
    board.worker_update(0, state="idle")


def test_dashboard_done_count_rises_live(tmp_path):
    board = make_board(total_prompts=40, skipped=4, history_bucket_s=0.5)
    board.set_phase("running")
    board.server_update("http://127.0.0.1:8001", health="ok", restarts=0, in_flight=2)
    board.server_update("http://127.0.0.1:8002", health="starting", restarts=1, in_flight=0)
    stop = threading.Event()
    feeder = threading.Thread(target=_feed, args=(board, stop), daemon=True)
    shot_dir = Path(os.environ.get("HALLULOG_SCREENSHOT_DIR", tmp_path))
    token = "browser-token"
    try:
        with StatusServer(board.snapshot, token=token, events_interval_s=0.25) as srv:
            result = watch_dashboard(
                srv.url + "/",
                token=token,
                rises=3,
                timeout_s=60,
                screenshot=shot_dir / "dashboard.png",
                on_loaded=feeder.start,
            )
    finally:
        stop.set()
        feeder.join(5)
    values = result["values"]
    print(f"\ndone counts seen in the browser: {values}")
    print(f"dashboard screenshot: {result['screenshot']}")
    assert len(values) >= 4 and values == sorted(set(values))
    assert result["connection"] == "live"
    png = Path(result["screenshot"]).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000

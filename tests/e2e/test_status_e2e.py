"""The status API during a real run on the embedded backend, and the dashboard in Chromium."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.api import dashboard_browser as browser
from tests.e2e.conftest import REPO, free_port_block, orchestrator_cmd

pytestmark = pytest.mark.e2e


def _poll(url: str, predicate, timeout: float, proc: subprocess.Popen) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        try:
            snap = httpx.get(f"{url}/status", timeout=5).json()
            if predicate(snap):
                return snap
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError("status never reached the expected state")


def test_status_json_metrics_and_dashboard_during_a_real_run(tmp_path: Path):
    if browser.missing_browser() is not None:  # before the run starts, never mid-test
        pytest.skip(browser.missing_browser())
    status_port = free_port_block(1)
    url = f"http://127.0.0.1:{status_port}"
    cmd = orchestrator_cmd(
        tmp_path / "run",
        "--limit",
        "8",
        "--k-samples",
        "1",
        "--max-tokens",
        "12",
        "--groups-in-flight",
        "1",
        "--status-port",
        str(status_port),
    )
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        snap = _poll(
            url, lambda s: s["phase"] == "running" and s["prompts"]["done"] >= 1, 600, proc
        )
        assert snap["prompts"]["total"] == 8
        assert snap["config"]["k_samples"] == 1
        assert len(snap["fingerprint"]) == 64 and snap["run_id"]
        assert snap["artifact_root"] == str(tmp_path / "run")
        assert snap["generations"] == 2 * snap["prompts"]["done"]
        assert snap["tokens"] > 0 and snap["rates"]["tokens_per_s"]["overall"] > 0
        assert [w["id"] for w in snap["workers"]] == [0]
        assert snap["servers"][0]["health"] == "healthy"

        metrics = httpx.get(f"{url}/metrics", timeout=5).text
        families = {f.name: f for f in text_string_to_metric_families(metrics)}
        done = families["hallulog_prompts_done"].samples[0].value
        assert done >= 1
        assert families["hallulog_prompts"].samples[0].value == 8

        shot_dir = Path(os.environ.get("HALLULOG_SCREENSHOT_DIR", tmp_path))
        shot_dir.mkdir(parents=True, exist_ok=True)
        seen = browser.watch_dashboard(
            url + "/", rises=2, timeout_s=300, screenshot=shot_dir / "dashboard-real-run.png"
        )
        assert seen["values"][-1] >= seen["values"][0] + 2
        assert Path(seen["screenshot"]).stat().st_size > 10_000
        print(f"dashboard screenshot during a real run: {seen['screenshot']}")
        assert proc.wait(timeout=600) == 0
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)

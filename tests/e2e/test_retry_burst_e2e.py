"""A burst of server faults costs time, not prompts (orchestrator/run/dispatch.py re-queues).

A real run (the orchestrator against an instant backend behind tests/e2e/faulty_proxy.py)
meets 503s on every generation request for 8 s — longer than the worker client's own three
attempts — starting with its first request. The groups that fail are queued again after the
backoff, and the run ends with every prompt done, none failed, and each failed attempt in
errors.jsonl.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from bench.instant_run import InstantFleet, write_task
from tests.e2e.conftest import REPO, worker_rows
from tests.e2e.faulty_proxy import FaultyProxy

pytestmark = pytest.mark.e2e

BURST_SECONDS = 8.0


def test_a_burst_of_503s_is_retried_not_failed(tmp_path):
    started: list[float] = []

    def burst(method: str, path: str, body: bytes):
        if method != "POST" or "completions" not in path:
            return None
        now = time.monotonic()
        started[:] = started or [now]
        return "503" if now - started[0] < BURST_SECONDS else None

    prompts, k = 40, 2
    task = tmp_path / "q.jsonl"
    write_task(task, prompts)
    with (
        InstantFleet(tmp_path / "fleet") as fleet,
        FaultyProxy(fleet.urls[0], fault=burst) as proxy,
    ):
        fleet.urls = [proxy.url]  # the run talks to the proxy
        root = tmp_path / "run"
        env = {**fleet.env, "HALLULOG_GROUP_RETRY_BACKOFF": "2"}
        t0 = time.monotonic()
        proc = subprocess.run(
            fleet.command(root, task, k=k, extra=["--groups-in-flight", "4"]),
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )
        wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{prompts}/{prompts} prompts done" in proc.stdout and " 0 failed" in proc.stdout
    assert len(proxy.injected) > 0 and wall > BURST_SECONDS  # the burst cost time...
    gens = worker_rows(root, "generations.jsonl")
    assert (
        len({(g["prompt_id"], g["sample_id"]) for g in gens}) == prompts * (k + 1) == len(gens)
    )  # ...not prompts
    errors = worker_rows(root, "errors.jsonl")
    assert errors and all(e["error_type"] == "generation_failed" for e in errors)
    assert "queued again in" in proc.stderr
    report = json.loads((root / "consolidated" / "validation_report.json").read_text())
    assert report["ok"], report.get("problem_counts")

"""Fenced leases, with real processes: a run paused (SIGSTOP) past its lease while its segment's
manifest is on the wire, another run taking the prefix over, then the paused one resumed
(SIGCONT). The late manifest lands after the successor's fence: it is refused (412), the
paused run stops in one line, and none of its late segment is consolidated; the successor's
root holds every prompt exactly once.

Real parts throughout: an S3 server (moto, its own process), a proxy in front of it for the
paused run only (tests/e2e/faulty_proxy.py, which holds that one PUT until the test lets it go),
instant backends and the orchestrator CLI.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.s3_server import MotoServer

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PROMPTS = 150


@pytest.fixture(scope="module")
def s3():
    with MotoServer() as server:
        server.create_bucket("fenced", versioned=True)
        yield server


def _keys(s3) -> set[str]:
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket="fenced")
    return {o["Key"] for page in pages for o in page.get("Contents", [])}


def _wait(what: str, cond, timeout: float = 120, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert proc is None or proc.poll() is None, f"the run exited before {what}"
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.05)


def test_a_paused_holders_late_segment_is_never_consolidated(s3, tmp_path, monkeypatch):
    from hallulog.cli.push_pull import pull_root

    from bench.instant_run import InstantFleet, write_task
    from tests.e2e.faulty_proxy import FaultyProxy

    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    url, lease = "s3://fenced/study", 8.0
    task = tmp_path / "task.jsonl"
    write_task(task, PROMPTS)
    held, release = threading.Event(), threading.Event()
    late: list[bytes] = []
    # worker_0's manifests: 0 is the session's fence, 1 the first segment; hold the second
    second = re.compile(r"/fenced/study/\.hallulog-run/segments/worker_0/00000002\.json$")

    def fault(method: str, path: str, body: bytes):
        if method == "PUT" and second.search(path) and not held.is_set():
            late.append(body)
            held.set()
            return ("hold", release)
        return None

    with (
        # answers after 100 ms: the run is never done within two cuts
        InstantFleet(tmp_path / "fleet", servers=1, latency_ms=100) as fleet,
        FaultyProxy(s3.endpoint, fault=fault) as proxy,
    ):
        env = {
            **fleet.env,
            **s3.env,
            "HOME": str(tmp_path / "home"),
            "HALLULOG_ROOT_LEASE_SECONDS": str(lease),
        }

        def command(node: str) -> list[str]:
            extra = ["--checkpoint-interval", "0.3", "--staging-dir", str(tmp_path / node)]
            return fleet.command(url, task, k=1, extra=extra)

        holder = subprocess.Popen(
            command("node-a"),
            env={**env, "AWS_ENDPOINT_URL": proxy.url},  # the paused run's requests: the proxy
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        successor = None
        try:
            _wait("the held manifest", held.is_set, proc=holder)
            os.killpg(holder.pid, signal.SIGSTOP)  # paused with its manifest on the wire
            assert "study/.hallulog-tree.json" not in _keys(s3)
            lock = json.loads(
                s3.client()
                .get_object(Bucket="fenced", Key="study/.hallulog-run/lock.json")["Body"]
                .read()
            )
            assert lock["pid"] == holder.pid and lock["epoch"] == 1
            # the bucket's status: a live holder (its lease not stale yet), segments shipped
            status = subprocess.run(
                [sys.executable, "-m", "orchestrator", "status", url, "--json"],
                env={**env, "HALLULOG_ROOT_LEASE_SECONDS": "600"},  # however slow this is
                cwd=REPO,
                capture_output=True,
                text=True,
            )
            snap = json.loads(status.stdout)
            assert snap["phase"] == "running" and snap["lease"]["pid"] == holder.pid, snap
            assert 0 < snap["prompts"]["done"] < PROMPTS
            _wait(
                "a stale lease",
                lambda: time.time() - lock["heartbeat"] > lease + 0.5,
                timeout=lease * 4,
            )
            successor = subprocess.Popen(
                command("node-b"),
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            # the successor has taken the lease over and fenced every chain (epoch 2)
            _wait(
                "the successor's epoch",
                lambda: "study/.hallulog-run/epochs/00000002.json" in _keys(s3),
                proc=successor,
            )
            release.set()  # the late manifest goes on to the server now
            _wait("the late manifest's answer", lambda: proxy.answered)
            os.killpg(holder.pid, signal.SIGCONT)
            out, err = successor.communicate(timeout=300)
            assert successor.returncode == 0, err
            assert f"bucket: {url} (" in out
            _, held_err = holder.communicate(timeout=120)
        finally:
            release.set()
            for proc in (holder, successor):
                if proc is not None and proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    # the late manifest met the successor's fence: refused, never part of the chain
    assert proxy.answered[0][1:] == (
        "PUT",
        "/fenced/study/.hallulog-run/segments/worker_0/00000002.json",
        412,
    )
    doc = json.loads(late[0])
    assert doc["epoch"] == 1 and doc["prompt_ids"]
    assert holder.returncode == 1, held_err
    assert f"error: {url}: this run lost its lease to run (pid " in held_err

    # none of the late segment consolidated by the paused run: every prompt once, the
    # successor's (it redid the late segment's prompts)
    pulled = tmp_path / "pulled"
    pull_root(url, pulled)
    gens = Counter(
        (r["prompt_id"], r["sample_id"])
        for r in map(json.loads, (pulled / "consolidated" / "generations.jsonl").open())
    )
    assert set(gens.values()) == {1} and len(gens) == PROMPTS * 2
    assert json.loads((pulled / "consolidated" / "validation_report.json").read_text())["ok"]
    committed = Counter(
        json.loads(line)["prompt_id"]
        for w in pulled.glob("worker_*")
        for line in (w / "prompt_index.jsonl").open()
    )
    assert set(committed.values()) == {1} and set(doc["prompt_ids"]) <= set(committed)
    manifest = json.loads((pulled / "run_manifest.json").read_text())
    assert manifest["artifact_root"] == str(tmp_path / "node-b")

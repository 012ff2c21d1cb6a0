"""One writer per artifact root (contracts/root_lock.py), with real processes and real runs.

A live run (the real orchestrator against an instant backend, paused with SIGSTOP so it stays
live as long as the test needs) holds its root: a second run on it is refused with one line
naming the holder, and the root is left as it was. SIGKILLed, the holder's lock is taken over
by the next run, which completes. The lease (shared file systems) is checked with records of
another host.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hallulog.contracts.root_lock import LOCK_FILE, RootLocked, holder_of, root_lock

from bench.instant_run import InstantFleet, write_task

REPO = Path(__file__).resolve().parents[2]


def _wait_holder(root: Path, proc: subprocess.Popen, timeout: float = 120.0) -> dict:
    pid = proc.pid
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"the run ended ({proc.returncode}) before it was seen holding "
                f"{root}: {proc.stderr.read()[-2000:]}"
            )
        rec = holder_of(root)
        if rec and rec.get("pid") == pid:
            return rec
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} never took {root / LOCK_FILE}")


@pytest.fixture
def fleet(tmp_path):  # noqa: D401
    with InstantFleet(tmp_path / "fleet") as f:
        yield f


@pytest.mark.e2e  # real runs (about 30 s)
def test_second_run_on_a_live_root_is_refused_and_a_killed_holder_is_taken_over(tmp_path, fleet):
    task = tmp_path / "q.jsonl"
    write_task(task, 300)
    root = tmp_path / "run"
    cmd = fleet.command(root, task, k=2, extra=["--consolidate", "false"])
    holder = subprocess.Popen(
        cmd,
        env=fleet.env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        rec = _wait_holder(root, holder)
        os.killpg(holder.pid, signal.SIGSTOP)  # live, holding the root, doing nothing
        assert rec["command"] == "run" and rec["host"] == socket.gethostname()
        before = sorted(p.name for p in root.iterdir())
        manifest = (
            (root / "run_manifest.json").read_bytes()
            if (root / "run_manifest.json").exists()
            else None
        )

        second = subprocess.run(
            cmd, env=fleet.env, cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert second.returncode == 1
        lines = [line for line in second.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, second.stderr
        assert (
            f"{root} is in use by run (pid {holder.pid} on {socket.gethostname()}, since "
            f"{rec['since']})" in lines[0]
        )
        assert sorted(p.name for p in root.iterdir()) == before  # nothing touched
        if manifest is not None:
            assert (root / "run_manifest.json").read_bytes() == manifest

        # a read-only command works beside the live run
        status = subprocess.run(
            [sys.executable, "-m", "orchestrator", "status", "--artifact-root", str(root)],
            env=fleet.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.returncode == 0, status.stderr

        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        third = subprocess.run(
            cmd, env=fleet.env, cwd=REPO, capture_output=True, text=True, timeout=300
        )
        assert third.returncode == 0, third.stderr
        assert "taking over" in third.stderr and f"pid {holder.pid}" in third.stderr
        assert holder_of(root) is None  # released at the end
        lines = (root / "worker_0" / "generations.jsonl").read_text().splitlines()
        keys = [(json.loads(x)["prompt_id"], json.loads(x)["sample_id"]) for x in lines]
        assert len(set(keys)) == 300 * 3
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait()


def test_a_held_root_is_refused_to_another_process_and_reentrant(tmp_path):
    with root_lock(tmp_path, "consolidate") as rec:
        with root_lock(tmp_path, "run") as inner:  # re-entrant: retry runs run
            assert inner is rec
        assert holder_of(tmp_path)["pid"] == os.getpid()
        child = subprocess.run(
            [
                sys.executable,
                "-c",
                f"""
from hallulog.contracts.root_lock import root_lock, RootLocked
try:
    with root_lock({str(tmp_path)!r}, "merge"):
        print("acquired")
except RootLocked as exc:
    print(exc)
""",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert child.stdout.startswith(f"{tmp_path} is in use by consolidate (pid {os.getpid()}")
    assert holder_of(tmp_path) is None


def _lease(root: Path, **fields) -> None:
    rec = {
        "command": "run",
        "pid": 4242,
        "host": "node-elsewhere",
        "start": None,
        "since": "2026-01-01T00:00:00+0000",
        "heartbeat": time.time(),
        **fields,
    }
    (root / LOCK_FILE).write_text(json.dumps(rec) + "\n")


def test_lease_of_another_host_holds_until_its_heartbeat_is_stale(tmp_path, monkeypatch):
    # flock does not cross hosts on many shared file systems: a fresh lease from elsewhere holds
    _lease(tmp_path)
    with pytest.raises(RootLocked, match=r"in use by run \(pid 4242 on node-elsewhere"):
        with root_lock(tmp_path, "run", lease=60):
            pass
    _lease(tmp_path, heartbeat=time.time() - 61)
    with root_lock(tmp_path, "run", lease=60) as rec:
        assert rec["pid"] == os.getpid()


def test_dead_pid_on_this_host_is_stale_and_a_live_heartbeat_is_renewed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _lease(tmp_path, host=socket.gethostname(), pid=dead.pid)
    with root_lock(tmp_path, "run", lease=0.4) as rec:
        first = rec["heartbeat"]
        time.sleep(0.5)
        assert holder_of(tmp_path)["heartbeat"] > first

"""Faults injected into real worker processes during a real run.

``HALLULOG_FAULTS`` (workers/_faults.py) makes a worker's n-th write under its directory fail:
``err=crash`` SIGKILLs the worker in the middle of a group's persist (the pool recovers the
directory and restarts the worker, which crashes again at its n-th write: several real crashes
per run); ``err=EIO`` with ``every=`` fails writes all along (each failed group is rolled back
in place and the worker goes on). Either way the run, or its rerun, ends with every prompt
committed exactly once and the artifacts valid.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, read_jsonl, worker_rows

pytestmark = pytest.mark.e2e
RUN = (
    "--limit",
    "3",
    "--k-samples",
    "1",
    "--max-tokens",
    "6",
    "--storage-format",
    "packed",
    "--progress",
    "false",
)


def _run(root: Path, port: str, faults: str | None, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("HALLULOG_FAULTS", None)
    if faults:
        env["HALLULOG_FAULTS"] = faults
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "run",
            "--artifact-root",
            str(root),
            "--server-base-port",
            port,
            *RUN,
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=REPO,
        env=env,
    )


def _exactly_once(root: Path) -> None:
    prompts = read_jsonl(root / "consolidated" / "prompt_index.jsonl")
    assert len(prompts) == 3 and len({p["prompt_id"] for p in prompts}) == 3
    committed = [r["prompt_id"] for r in worker_rows(root, "prompt_index.jsonl")]
    keys = [r["activation_key"] for r in worker_rows(root, "activation_index.jsonl")]
    assert len(keys) == len(set(keys)), "an activation was committed twice"
    assert set(committed) == {p["prompt_id"] for p in prompts}


def test_worker_sigkilled_mid_persist_recovers_exactly_once(tmp_path):
    root = tmp_path / "run"
    # a group writes 7 times (2 samples x shard + commit log, 3 JSONL files), a new store its
    # commit log header once: the 10th write is inside the second group of each lifetime
    # One group in flight: a worker killed while another of its threads waits in the shared
    # task queue's get() would take the queue's lock with it (multiprocessing.Queue holds it
    # while blocking), and every restarted worker would wait forever -- the pool's channel
    # (runloop branch) has to fix that; here the kill lands while no get() is pending.
    first = _run(
        root, "9320", "op=write,nth=10,err=crash,path=worker_0/", "--groups-in-flight", "1"
    )
    deaths = first.stderr.count("worker 0 died")
    assert deaths >= 1, first.stderr[-3000:]  # the fault really killed the worker mid-persist
    print(f"worker SIGKILLed mid-persist {deaths} time(s); exit {first.returncode}")
    if first.returncode != 0:  # out of restarts: the rerun (no faults) finishes the job
        assert "Traceback" not in first.stderr.split("error:")[-1]
        first = _run(root, "9320", None, "--groups-in-flight", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "validation OK" in first.stdout
    _exactly_once(root)


def test_eio_all_along_rolls_groups_back_in_place(tmp_path):
    root = tmp_path / "run"
    first = _run(root, "9325", "op=write,every=9,err=EIO,path=worker_0/")
    assert first.returncode in (0, 3), first.stderr[-3000:]
    errors = worker_rows(root, "errors.jsonl")
    assert any(
        e["error_type"] == "storage_error" and "injected" in e["error_message"] for e in errors
    ), errors
    # a group of 7 writes, every 9th fails: groups commit after a failed (rolled back) one
    # -- the case where the failed group's samples used to poison the store
    assert worker_rows(root, "prompt_index.jsonl"), first.stderr[-3000:]
    second = _run(root, "9325", None)  # resume: the failed prompts are done now, once
    assert second.returncode == 0, second.stderr[-3000:]
    assert "validation OK" in second.stdout
    _exactly_once(root)

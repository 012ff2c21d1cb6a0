"""End-to-end fixtures: real `python -m orchestrator run` processes on the real SmolLM2 model."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def free_port_block(size: int = 4) -> int:
    """A base port with ``size`` free ports after it (best effort)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + size > 65000:
            continue
        ok = True
        for p in range(base, base + size):
            with socket.socket() as t:
                try:
                    t.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port block")


def orchestrator_cmd(root: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "orchestrator",
        "run",
        "--artifact-root",
        str(root),
        "--server-base-port",
        str(free_port_block()),
        "--progress",
        "false",
        *args,
    ]


def run_orchestrator(root: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        orchestrator_cmd(root, *args),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=dict(os.environ),
    )
    return proc


def run_with_saboteur(
    cmd: list[str], saboteur: Callable[[subprocess.Popen], None], *, timeout: float
) -> tuple[int, str, str]:
    """Run ``cmd`` (an orchestrator) while ``saboteur(proc)`` works on a thread beside it (it
    kills workers, servers or engines); the run is killed if it outlives ``timeout``.
    Returns ``(returncode, stdout, stderr)``."""
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    thread = threading.Thread(target=saboteur, args=(proc,), daemon=True)
    thread.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    thread.join(timeout=10)
    return proc.returncode, out, err


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def worker_rows(root: Path, name: str) -> list[dict]:
    rows = []
    for wdir in sorted(root.glob("worker_*")):
        if (wdir / name).exists():
            rows += read_jsonl(wdir / name)
    return rows


@pytest.fixture(scope="session")
def small_run(tmp_path_factory) -> Path:
    """10 prompts, K=2, the integrated profile, npy store, on the embedded server."""
    root = tmp_path_factory.mktemp("run10")
    proc = run_orchestrator(
        root,
        "--limit",
        "10",
        "--k-samples",
        "2",
        "--max-tokens",
        "24",
        "--num-workers",
        "2",
        "--groups-in-flight",
        "2",
        "--storage-format",
        "npy",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root

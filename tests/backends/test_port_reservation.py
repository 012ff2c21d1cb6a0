"""Ports a run chooses itself are reserved for its life (backends/ports.py): two runs choosing at
the same instant never get the same port; a killed holder's reservation ends with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hallulog.backends.ports import choose_ports, release_port, reservation_dir
from hallulog.contracts.errors import BackendStartError

REPO = Path(__file__).resolve().parents[2]
HOLD = """
import sys, time
from hallulog.backends.ports import choose_ports
print(",".join(map(str, choose_ports({count}, None))), flush=True)
time.sleep(600)
"""


@pytest.fixture
def port_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HALLULOG_PORT_DIR", str(tmp_path / "ports"))
    return tmp_path / "ports"


def _holder(count: int) -> tuple[subprocess.Popen, list[int]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD.format(count=count)],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    return proc, [int(p) for p in proc.stdout.readline().split(",")]


def test_concurrent_choices_are_disjoint_and_end_with_their_holder(port_dir):
    holder, theirs = _holder(2)
    try:
        assert reservation_dir() == port_dir
        mine = choose_ports(2, None)
        assert not set(mine) & set(theirs)
        for port in mine:
            release_port(port)
        # an explicit port another run reserved is an error naming it, not a fight
        with pytest.raises(BackendStartError, match=f"port {theirs[0]} .*reserved by another"):
            choose_ports(1, theirs[0])
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        again = choose_ports(2, None)  # the kernel released the dead holder's flocks
        assert set(again) & set(theirs) or again[0] <= min(theirs)
        for port in again:
            release_port(port)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()

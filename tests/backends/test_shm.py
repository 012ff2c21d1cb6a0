"""Shared memory left by SIGKILLed processes is removed; a live process's is kept (backends/shm.py).

Real processes create real POSIX shared memory (``psm_*``, Python's shared_memory, as vLLM's
message queues do; ``sem.loky-*``, loky's semaphores) and are killed with their whole process
group (their resource tracker too, as when a server's group is killed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from hallulog.backends.shm import SHM_DIR, shm_names, sweep

MAKE = """
import sys, time
from multiprocessing import shared_memory
shm = shared_memory.SharedMemory(create=True, size=1 << 20)
names = [shm.name]
try:
    from joblib.externals.loky.backend.synchronize import Semaphore
    sem = Semaphore(1)
    names.append("sem." + sem._semlock.name.lstrip("/"))
except Exception:
    pass
print(" ".join(names), flush=True)
time.sleep(600)
"""

pytestmark = pytest.mark.skipif(not SHM_DIR.is_dir(), reason="no /dev/shm")


def _maker() -> tuple[subprocess.Popen, list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", MAKE], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    return proc, proc.stdout.readline().split()


def test_killed_groups_files_are_removed_live_ones_kept():
    live, live_names = _maker()
    dead, dead_names = _maker()
    try:
        assert set(live_names + dead_names) <= shm_names()
        os.killpg(dead.pid, signal.SIGKILL)
        dead.wait()
        assert set(dead_names) <= shm_names()  # left behind by the kill
        removed = sweep(set(live_names + dead_names), min_age=0)
        assert sorted(removed) == sorted(dead_names)
        assert set(live_names) <= shm_names()  # still mapped by a live process
        assert not set(dead_names) & shm_names()
    finally:
        for proc in (live, dead):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        sweep(set(live_names), min_age=0)
    assert not set(live_names) & shm_names()

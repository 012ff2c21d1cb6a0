"""One writer per worker directory (contracts/writer_lock.py), with real processes: a live
holder refuses a second writer, a recovery fences a leftover writer of an earlier session (kills
it on this host, waits for one elsewhere), and a worker started by a driver that died before it
came up exits instead of working."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hallulog.contracts import layout
from hallulog.contracts.process import pid_alive
from hallulog.contracts.writer_lock import WriterBusy, fence_writer, hold_writer

REPO = Path(__file__).resolve().parents[2]


def holder(directory: Path, *, host: str | None = None) -> subprocess.Popen:
    """A process that holds ``directory``'s writer lock (as ``host`` when given) until killed;
    returns once the lock is held."""
    code = textwrap.dedent(
        f"""
        import json, os, sys, time
        from hallulog.contracts.writer_lock import hold_writer
        lock = hold_writer({str(directory)!r})
        host = {host!r}
        if host:  # pretend to be a writer on another node
            rec = json.loads(open(lock.path).read())
            rec["host"] = host
            with open(lock.path, "w") as f:  # a second open: the flock stays with the first
                f.write(json.dumps(rec) + "\\n")
        print("held", flush=True)
        time.sleep(600)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    proc = holder(tmp_path)
    try:
        with pytest.raises(WriterBusy, match=f"pid {proc.pid} on "):
            hold_writer(tmp_path)
    finally:
        proc.kill()
        proc.wait()
    hold_writer(tmp_path).release()  # the kernel let go with the holder


def test_the_fence_ends_a_leftover_writer_on_this_host(tmp_path):
    proc = holder(tmp_path)
    start = time.monotonic()
    with fence_writer(tmp_path, timeout=30):
        assert proc.wait(timeout=10) == -signal.SIGKILL
        with pytest.raises(WriterBusy):  # the fence holds it while the body runs
            hold_writer(tmp_path)
    assert time.monotonic() - start < 10
    hold_writer(tmp_path).release()


def test_the_fence_waits_for_a_writer_on_another_host(tmp_path):
    proc = holder(tmp_path, host="node-elsewhere")
    try:
        with pytest.raises(WriterBusy, match="node-elsewhere.*not released in 1 s"):
            with fence_writer(tmp_path, timeout=1):
                pass
        assert proc.poll() is None  # not ours to kill: on another node
        # its record is intact for the next reader
        assert json.loads((tmp_path / layout.WRITER_LOCK).read_text())["pid"] == proc.pid
    finally:
        proc.kill()
        proc.wait()
    with fence_writer(tmp_path, timeout=5):
        pass


def test_a_child_whose_parent_died_before_it_came_up_exits(tmp_path):
    """``die_with_parent(sig, parent_pid)`` in a process whose parent is not ``parent_pid`` any
    more (reparented while it started) exits with status 1 at once."""
    code = (
        "import signal; from hallulog.contracts.process import die_with_parent; "
        "die_with_parent(signal.SIGKILL, 1); print('working')"
    )
    here = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert here.returncode == 1 and "working" not in here.stdout
    code_ok = code.replace(", 1)", f", {os.getpid()})")
    ok = subprocess.run([sys.executable, "-c", code_ok], cwd=REPO, capture_output=True, text=True)
    assert ok.returncode == 0 and "working" in ok.stdout


def test_pid_alive_tells_a_reused_pid_apart():
    assert pid_alive(os.getpid(), None)
    assert not pid_alive(os.getpid(), "0")

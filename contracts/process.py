"""Process helpers shared by the orchestrator's children (workers, servers) and the locks."""

from __future__ import annotations

import os
import signal
from pathlib import Path

__all__ = ["die_with_parent", "proc_start", "pid_alive"]


def die_with_parent(sig: int = signal.SIGTERM, parent_pid: int | None = None) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies (no-op elsewhere).

    A SIGKILLed orchestrator cannot stop its children; this makes them go with it. The request
    only covers a parent that is alive when it is made: a child started by ``parent_pid`` that
    finds another parent (it was reparented while it started up: the driver died before this
    call) exits at once with status 1, since nobody is left to tell it what to do and whatever
    it holds (the groups already in its pipe) has been handed to the next run.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)  # checked after the prctl: a parent dying in between still sends ``sig``


def proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (tells a reused pid apart)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def pid_alive(pid: int, start: str | None) -> bool:
    """Whether ``pid`` runs (not a zombie) and, when ``start`` is given, is the process that
    started then (not a reused pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    now = proc_start(pid)
    if now is None:  # gone, or a zombie whose stat we cannot read: not holding anything
        return Path(f"/proc/{pid}").exists() and start is None
    if start is not None and now != start:
        return False  # the pid was reused
    try:  # a zombie (killed, not yet reaped) holds nothing
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (OSError, IndexError):
        return False

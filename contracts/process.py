"""Process helpers shared by the orchestrator's children (workers, servers)."""

from __future__ import annotations

import signal

__all__ = ["die_with_parent"]


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies (no-op elsewhere).

    A SIGKILLed orchestrator cannot stop its children; this makes them go with it.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass

"""The server's memory: the key/value cache's budget, shared by the engines, and the process's
resident size.

The weights are fixed once loaded (``hallulog.serving.decode.FusedDecoder.release_model_weights``
keeps the packed matrices only once); what grows with the traffic is the key/value cache (one
row per running sequence, as many columns as the longest of them: ``SlotKVCache``) and a step's
buffers. ``KVBudget`` bounds the cache: an engine admits a waiting sequence only when the caches
of every engine, with that sequence at its longest (prompt + ``max_tokens``), stay within the
budget; the others wait in the queue (they hold no cache). An engine with no running sequence
always admits one, so a sequence larger than the budget still runs, alone.

The budget comes from ``--max-memory-gb`` (``plan_budget``): what the process holds once its
weights are loaded and packed, and ``STEP_RESERVE`` for a step's buffers (logits, activations,
the capture rows of a pass on their way to the spool files), are taken from it; without the
flag it is ``DEFAULT_KV_BYTES``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import resource
import sys
import threading
import time

__all__ = [
    "DEFAULT_KV_BYTES",
    "STEP_RESERVE",
    "KVBudget",
    "plan_budget",
    "release_freed_memory",
    "resident_bytes",
    "trim_heap",
]

logger = logging.getLogger(__name__)

GB = 1e9
DEFAULT_KV_BYTES = int(1.2 * GB)
"""The key/value cache's budget without ``--max-memory-gb``: the default job's traffic (32
groups of 6 answers in flight, prompts of ~55 tokens, 64 new tokens) at its longest takes
~0.97 GB of SmolLM2-135M's cache (``kvslots.kv_bytes``), so none of it waits."""
STEP_RESERVE = int(0.25 * GB)
"""Kept for a step's buffers beside the cache when ``--max-memory-gb`` sets the budget."""
MIN_KV_BYTES = int(0.05 * GB)


def resident_bytes() -> int:
    """This process's resident set size now (Linux), else its peak so far."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def _malloc_trim():
    """glibc's ``malloc_trim``, or None (another C library, another system)."""
    name = ctypes.util.find_library("c") if sys.platform.startswith("linux") else None
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


_trim = _malloc_trim()
_trim_lock = threading.Lock()
_trimmed_at = [0.0]
TRIM_EVERY_S = 1.0


def release_freed_memory() -> None:
    """Collect garbage and hand the C heap's free pages back to the system."""
    gc.collect()
    if _trim is not None:
        _trim(0)


def trim_heap() -> None:
    """Hand the C heap's free pages back to the system, at most every ``TRIM_EVERY_S``
    seconds (engines call it after each step). A step's buffers of a few MB come from the heap
    and leave holes that a later step may not fill: without this the process's resident size
    creeps up with the traffic."""
    if _trim is None:
        return
    now = time.monotonic()
    if now - _trimmed_at[0] < TRIM_EVERY_S or not _trim_lock.acquire(blocking=False):
        return
    try:
        _trimmed_at[0] = now
        _trim(0)
    finally:
        _trim_lock.release()


def plan_budget(max_memory_gb: float | None, static_bytes: int) -> int:
    """The key/value cache's budget in bytes: ``DEFAULT_KV_BYTES`` without ``max_memory_gb``,
    else what ``static_bytes`` (the process with its weights) and ``STEP_RESERVE`` leave of it.
    Raises ValueError naming the flag when that is too little to run."""
    if max_memory_gb is None:
        return DEFAULT_KV_BYTES
    budget = int(max_memory_gb * GB) - static_bytes - STEP_RESERVE
    if budget < MIN_KV_BYTES:
        need = (static_bytes + STEP_RESERVE + MIN_KV_BYTES) / GB
        raise ValueError(
            f"--max-memory-gb {max_memory_gb:g} is too little: the loaded model takes "
            f"{static_bytes / GB:.2f} GB, a step's buffers {STEP_RESERVE / GB:.2f} GB; give at "
            f"least {need:.2f}"
        )
    return budget


class KVBudget:
    """Bytes of key/value cache the engines may hold together; each engine states what its
    running sequences need at their longest (``claim``) and gives it back as they finish."""

    def __init__(self, limit: int):
        self.limit = limit
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}

    def claim(self, owner: int, need: int) -> bool:
        """Let ``owner`` hold ``need`` bytes from now on, if the others leave room for it (or
        ``owner`` held nothing: one sequence always runs). True when granted."""
        with self._lock:
            others = sum(v for k, v in self._held.items() if k != owner)
            if others + need > self.limit and self._held.get(owner, 0) > 0:
                return False
            self._held[owner] = need
            return True

    def set(self, owner: int, need: int) -> None:
        """``owner`` holds ``need`` bytes (fewer sequences running: always granted)."""
        with self._lock:
            self._held[owner] = need

    @property
    def held(self) -> int:
        with self._lock:
            return sum(self._held.values())

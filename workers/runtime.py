"""How a worker process runs its event loop: uvloop where installed, a collector tuned to it,
blocking calls handed to a thread."""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any, TypeVar

__all__ = ["tune_gc", "run_event_loop", "run_on"]

T = TypeVar("T")


def tune_gc() -> None:
    """Make the cyclic garbage collector cheap for a worker's allocation pattern.

    Every reply allocates a few hundred dicts and lists (a top-5 logprob entry per token), none
    of them in a cycle, which ran a collection every few replies; the older generations' walk
    over every object the imports made came to ~8 % of a worker's CPU against the instant
    backend (``gc.callbacks`` timing: 1.7 s of 22 s), most of it billed to ``orjson.loads``.
    The imports' objects are frozen (never scanned again) and a collection runs per 20,000
    net allocations instead of 700; cyclic garbage is rare here and still collected.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


def run_event_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop's loop where it is installed (its socket, timer and thread
    hand-off paths cost a worker ~10 % less CPU per generation against the instant backend),
    else on asyncio's."""
    try:
        import uvloop
    except ImportError:
        uvloop = None
    if uvloop is None or sys.version_info < (3, 11):  # asyncio.Runner is 3.11+
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


async def run_on(executor: Executor, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on ``executor``'s thread, awaited from the running event loop."""
    return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)

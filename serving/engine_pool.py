"""Several engines over one model, each decoding its own batch on its own thread.

On a CPU a decode step is partly serial (Python, small ops, sampling, capture copies) while its
matrix products take the intra-op threads, so one engine leaves cores idle. ``EnginePool`` runs
``count`` engines (``--engines``) that share the model and its packed weights
(``hallulog.serving.decode.FusedDecoder`` holds no per-batch state); with as many intra-op threads each
as the cores allow, every core runs a whole step of its own (docs/serving.md, "Speed").

A sequence goes to the engine that already holds sequences of the same prompt (so a run's
``k + 1`` answers of one question, sent as separate requests, still share one prefill), else to
the engine with the fewest sequences outstanding. Every engine reports into the same metrics.
Only the fused path can be shared this way (the model's own forward records capture through
hooks on shared modules): other models get one engine.

The engines adapt to the load: while fewer than ``solo_below`` sequences are outstanding, new
prompts go to the first engine, which takes every engine's threads as intra-op threads once the
others are idle (a small batch split between engines of one thread each leaves each a few rows
per step, and a step's cost hardly grows with its rows); above it they spread and each engine
has its own share of the threads again. The threads never change a result (docs/serving.md).
The engines share one key/value budget (``hallulog.serving.memory.KVBudget``).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
from collections.abc import Sequence

from hallulog.serving.engine import Engine
from hallulog.serving.memory import KVBudget
from hallulog.serving.sequences import SamplingParams

__all__ = ["EnginePool", "plan_threads"]

logger = logging.getLogger(__name__)

SOLO_BELOW = 24
"""Outstanding sequences below which new prompts go to the first engine (its batch is then too
small to be worth splitting)."""


def plan_threads(engines: int = 0, num_threads: int = 0) -> tuple[int, int]:
    """``(engines, intra-op threads per engine)`` for ``--engines``/``--num-threads`` (0: from
    the cores this process may use: two engines when there are two or more, the cores divided
    among them)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = max(1, cores or 1)
    engines = engines or min(2, cores)
    return engines, num_threads or max(1, cores // engines)


class EnginePool:
    """``count`` engines over ``loaded``; the engine interface the HTTP app uses.

    ``threads``: intra-op threads of each engine while the load is spread (None: leave torch's
    setting alone, and the first engine never takes the others' threads); ``solo_below``: see
    the module docstring (0: always spread); ``kv_budget``: bytes of key/value cache for the
    engines together (None: unbounded)."""

    def __init__(
        self,
        loaded,
        count: int = 1,
        *,
        threads: int | None = None,
        solo_below: int = SOLO_BELOW,
        kv_budget: int | None = None,
        **engine_args,
    ):
        if count < 1:
            raise ValueError("count must be >= 1")
        self.kv_budget = KVBudget(kv_budget) if kv_budget is not None else None
        first = Engine(loaded, kv_budget=self.kv_budget, budget_owner=0, **engine_args)
        if count > 1 and first._fused is None:
            logger.warning("this model decodes through its own forward: one engine, not %d", count)
            count = 1
        self.engines = [first] + [
            Engine(
                loaded,
                decoder=first._fused,
                kv_budget=self.kv_budget,
                budget_owner=index,
                **engine_args,
            )
            for index in range(1, count)
        ]
        self.threads = threads
        self.solo_below = solo_below if count > 1 else 0
        for index, engine in enumerate(self.engines):
            engine._thread.name = f"serving-engine-{index}"
        self.loaded = loaded
        self.tokenizer = first.tokenizer
        self._lock = threading.Lock()
        self._outstanding = [0] * count  # sequences submitted and not answered, per engine
        self._placed: dict[tuple[int, ...], list[int]] = {}  # prompt -> [engine, outstanding]
        self._set_threads()

    @property
    def capture_enabled(self) -> bool:
        return self.engines[0].capture_enabled

    def release_model_weights(self) -> int:
        """Drop the model's plain copies of the packed matrices (``FusedDecoder``); bytes
        dropped. The model's own forward cannot run afterwards."""
        first = self.engines[0]
        fused = first._fused
        return fused.release_model_weights(first.loaded.path) if fused is not None else 0

    def _set_threads(self) -> None:
        """Each engine's intra-op threads from its next step on: the first one takes every
        engine's threads while the others have nothing outstanding (under ``_lock``, or before
        the engines start)."""
        if self.threads is None:
            return
        alone = self.solo_below > 0 and not any(self._outstanding[1:])
        for index, engine in enumerate(self.engines):
            share = len(self.engines) if alone and index == 0 else 1
            engine.want_threads = self.threads * share

    def start(self) -> None:
        for engine in self.engines:
            engine.start()

    def stop(self, timeout: float = 10.0) -> None:
        for engine in self.engines:
            engine._stopping.set()
        for engine in self.engines:
            engine.stop(timeout)

    def submit(
        self, prompt_ids: Sequence[int], params: SamplingParams
    ) -> concurrent.futures.Future:
        """Queue one sequence on its engine; the future resolves to a ``SequenceOutput``."""
        key = tuple(prompt_ids)
        with self._lock:
            placed = self._placed.get(key)
            if placed is None:
                if sum(self._outstanding) < self.solo_below:
                    index = 0
                else:
                    index = min(range(len(self.engines)), key=self._outstanding.__getitem__)
                placed = self._placed[key] = [index, 0]
            index = placed[0]
            placed[1] += 1
            self._outstanding[index] += 1
            if index:
                self._set_threads()
        try:
            future = self.engines[index].submit(prompt_ids, params)
        except BaseException:
            self._done(key, index)
            raise
        future.add_done_callback(lambda _f: self._done(key, index))
        return future

    def _done(self, key: tuple[int, ...], index: int) -> None:
        with self._lock:
            self._outstanding[index] -= 1
            placed = self._placed[key]
            placed[1] -= 1
            if placed[1] == 0:
                del self._placed[key]
            if index and not self._outstanding[index]:
                self._set_threads()

"""Group commit in a worker: the prompt groups that finish while a commit is on the disk are
committed together by the next one (``WorkerDir.persist_groups``: one fsync per file for the
lot), on one thread kept for the run.

Commits start at most once per ``min_interval_s`` (``--commit-interval-ms``, 20 ms): against a
fast backend the groups of that slice share one commit (against the instant bench backend a
commit per group or two cost ~20 % of the run's CPU in fsyncs and thread hand-offs); against a
slow one a group finds the last commit long past and is committed at once, as before. A crash
loses at most the groups of the slice not yet committed, which the next run redoes. A batch that
fails is rolled back whole by ``persist_groups`` and retried one group at a time, so that one
group's error (a store refusing a key, say) is not its neighbours'.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hallulog.workers.persist import GenerationRecord, PersistBroken, WorkerDir
from hallulog.workers.runtime import run_on

__all__ = ["GroupCommitter"]

_Pending = tuple[dict[str, Any], list[GenerationRecord], asyncio.Future]


class GroupCommitter:
    """Commits groups for one worker directory; :meth:`commit` is awaited once per group."""

    def __init__(self, out: WorkerDir, *, min_interval_s: float = 0.02) -> None:
        self.out = out
        self.min_interval_s = min_interval_s
        self._last_start = float("-inf")  # loop time the last commit started
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="commit")
        self._waiting: list[_Pending] = []
        self._draining: asyncio.Task | None = None

    async def commit(self, prompt_row: dict[str, Any], records: list[GenerationRecord]) -> None:
        """Commit one group, together with the others waiting then; raises its own error."""
        done = asyncio.get_running_loop().create_future()
        self._waiting.append((prompt_row, records, done))
        if self._draining is None or self._draining.done():
            self._draining = asyncio.create_task(self._drain())
        await done

    async def run(self, fn, *args: Any) -> Any:
        """``fn(*args)`` on the commit thread (after the commits handed over before it)."""
        return await run_on(self._thread, fn, *args)

    def close(self) -> None:
        """Wait for the commit thread to finish (call once no commit is awaited any more)."""
        self._thread.shutdown(wait=True)

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting:
            wait = self._last_start + self.min_interval_s - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)  # the groups finishing meanwhile join this commit
            batch, self._waiting = self._waiting, []
            self._last_start = loop.time()
            try:
                await self._commit_batch(batch)
            except BaseException as exc:  # e.g. a simulated crash: no group may wait for ever
                for *_, done in batch:
                    if not done.done():
                        done.set_exception(exc)
                raise

    async def _commit_batch(self, batch: list[_Pending]) -> None:
        try:
            await self.run(self.out.persist_groups, [(row, recs) for row, recs, _ in batch])
        except Exception as exc:
            if len(batch) == 1 or isinstance(exc, PersistBroken):
                for *_, done in batch:
                    done.set_exception(exc)
                return
            for one in batch:  # rolled back whole: find the group at fault
                await self._commit_batch([one])
            return
        for *_, done in batch:
            done.set_result(None)

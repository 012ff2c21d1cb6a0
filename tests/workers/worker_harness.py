"""Run the real worker (``workers.worker.GroupWorker``) on one prompt group in-process and return
the events it sent the driver: the shared harness of the worker tests against a live backend."""

from __future__ import annotations

import asyncio

from contracts.prompt_group import PromptGroup
from workers.worker import GroupWorker, WorkerSpec


def process_group(spec: WorkerSpec, group: PromptGroup) -> list[dict]:
    """Process ``group`` with a worker built from ``spec``; its events, in order."""
    events: list[dict] = []

    class Channel:
        def send(self, event: dict) -> None:
            events.append(event)

    async def main() -> None:
        worker = GroupWorker(spec, Channel())  # type: ignore[arg-type]
        try:
            await worker._process(group)
        finally:
            await worker.client.close()
            worker._loading.shutdown(wait=True)
            worker.committer.close()
            worker.out.close()

    asyncio.run(main())
    return events

"""The run: servers, the worker pool and its queue, the checkpoint, the watchdog and the status
board, driven by :func:`run` (``hallulog.orchestrator.run.loop``)."""

from hallulog.orchestrator.run.loop import RunResult, run

__all__ = ["run", "RunResult"]

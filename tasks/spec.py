"""The typed input of the tasks room: which task file a run reads, which of its records, and
how they become prompts (:class:`~hallulog.tasks.study.Study`).

A run's :class:`TaskSpec` is made once from its config (``RunConfig.task_spec``) and opened with
``hallulog.tasks.open_task_spec``; the tasks room never reads a config.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hallulog.tasks.study import Study

__all__ = ["TaskSpec"]


@dataclass(frozen=True)
class TaskSpec:
    """One task to read (the values of the flags of the same names)."""

    name: str
    """A built-in task, a preset or ``qa`` (``hallulog.tasks.TASKS``)."""
    path: str | None = None
    """Its dataset file (None: the bundled sample)."""
    split: str | None = None
    limit: int | None = None
    shard: str | None = None
    """``I/N``: only that shard of the prompts, after ``limit``."""
    study: Study = field(default_factory=Study)
    """The dataset mapping and the prompt."""

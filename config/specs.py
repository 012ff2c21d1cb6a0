"""The typed inputs of the rooms after the config, made from a :class:`RunConfig`: the engine
options of its servers (``backends``) and the task it reads (``tasks``). The run plan
(``config/plan.py``) and the config's own checks make them here, and nowhere else."""

from __future__ import annotations

import dataclasses
from typing import Any

from hallulog.backends.engine import ENGINE_FIELDS, EngineOptions
from hallulog.tasks.spec import TaskSpec
from hallulog.tasks.study import Study

__all__ = ["engine_options", "task_spec", "STUDY_FIELDS"]

STUDY_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Study))
"""``RunConfig``'s fields that make its :class:`Study` (each of the same name and default)."""


def engine_options(config: Any) -> EngineOptions:
    """The engine options of ``config``'s servers (a ``RunConfig``)."""
    return EngineOptions(**{name: getattr(config, name) for name in ENGINE_FIELDS})


def task_spec(config: Any) -> TaskSpec:
    """The task ``config`` (a ``RunConfig``) reads: file, records, shard and study."""
    return TaskSpec(
        name=config.task,
        path=config.task_path,
        split=config.split,
        limit=config.limit,
        shard=config.shard,
        study=Study(**{name: getattr(config, name) for name in STUDY_FIELDS}),
    )

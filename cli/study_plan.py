"""A study file planned: every cell's ``RunConfig`` built and its run planned before any starts.

The study file is a ``run --config`` file (config/config_file.py) plus an ``[axes]`` table
(study/axes.py). Each cell's keys are the shared keys with its axis values laid over them,
checked as ``--config`` checks a file, then made a ``RunConfig`` whose artifact root is
``STUDY/cells/<name>`` and planned as ``run`` plans it (``plan_task``, the model resolved,
``plan_run``: an unknown task, a task file that cannot be read, a layer the model lacks). The
first problem is one line naming the study file, the cell and the value; nothing has started
then. This lives in ``cli/`` because it needs the config, backends and plan rooms, which the
``study`` room (below them) may not import.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hallulog.config.config_file import dump_study, file_values, read_file
from hallulog.config.run_config import RunConfig
from hallulog.contracts.config_cli import literal_choices
from hallulog.contracts.errors import HallulogError
from hallulog.study.axes import AXES_TABLE, cell_keys, study_cell_values
from hallulog.study.manifest import Cell, make_cell, write_study
from hallulog.study.naming import AXES, StudyError

__all__ = ["PlannedCell", "StudyPlan", "plan_study", "write_cells", "ROOT_KEYS"]

ROOT_KEYS = ("artifact_root", "shard")
"""Run keys a study sets itself (each cell's root is ``cells/<name>``) and its file may not."""


@dataclass(frozen=True)
class PlannedCell:
    """One cell: its manifest entry (with the fingerprint of its plan) and its run config."""

    cell: Cell
    config: RunConfig
    plan: Any = None
    """Its ``RunPlan`` (None when the cells were built without planning)."""

    @property
    def name(self) -> str:
        return self.cell.name


@dataclass(frozen=True)
class StudyPlan:
    """A study file's cells under ``root``, in run order."""

    root: Path
    path: Path
    sha256: str
    axes: tuple[str, ...]
    cells: tuple[PlannedCell, ...]


def _choices() -> dict[str, list[Any]]:
    """The choices ``run``'s flags and ``--config`` check (cli/parsers.py ``task_choices``)."""
    from hallulog.tasks import TASKS

    return {
        **{name: list(values) for name, values in literal_choices(RunConfig).items()},
        "task": list(TASKS),
    }


def _cell_error(path: Path, name: str, exc: BaseException) -> StudyError:
    text = " ".join(str(exc).split()) or type(exc).__name__
    prefix = f"{path}: "
    if text.startswith(prefix):
        text = text[len(prefix) :]
    return StudyError(f"{path}: cell {name}: {text}")


def _config(
    path: Path, sha: str, shared: Mapping[str, Any], cell: Cell, root: Path, overrides: Mapping
) -> RunConfig:
    doc = {**shared, **cell_keys(cell.values)}
    for key in ROOT_KEYS:
        if key in doc:
            raise StudyError(
                f"{path}: cell {cell.name}: `{key}` is set by the study (each cell's root is "
                "--root/cells/<name>); remove it from the file"
            )
    try:
        values = file_values(path, doc, sha, choices=_choices())
        values.update(overrides)
        values["artifact_root"] = (root / cell.root).absolute()
        extra = dict(values.get("extra") or {})
        extra["study_cell"] = cell.name
        values["extra"] = extra
        return RunConfig(**values)
    except (HallulogError, ValueError, TypeError) as exc:
        raise _cell_error(path, cell.name, exc) from None


def _plan(path: Path, pc: PlannedCell, models: dict) -> PlannedCell:
    """The cell planned as ``run`` plans it (the model resolved once per model value)."""
    from hallulog.backends.models import hallulog_cache_dir, remote_model, resolve_model
    from hallulog.config.plan import plan_run, plan_task

    config = pc.config
    try:
        task = plan_task(config)
        if not task.prompt_ids:
            raise HallulogError(f"task {config.task} ({task.stream.source}) has no prompts")
        key = (config.model, config.manage_servers, tuple(config.server_urls))
        if key not in models:
            cache = hallulog_cache_dir(config.cache_dir)
            models[key] = (
                resolve_model(config.model, cache)
                if config.manage_servers
                else remote_model(config.server_urls[0], config.model, cache)
            )
        plan = plan_run(config, models[key], task)
    except (HallulogError, ValueError, OSError) as exc:
        raise _cell_error(path, pc.name, exc) from None
    cell = replace(pc.cell, fingerprint=plan.manifest.get("config_fingerprint"))
    return PlannedCell(cell, config, plan)


def plan_study(
    path: str | os.PathLike[str],
    root: str | os.PathLike[str],
    *,
    overrides: Mapping[str, Any] | None = None,
    plan: bool = True,
) -> StudyPlan:
    """Every cell of the study file at ``path`` under the study root ``root``: its config
    (``overrides``: run keys set for every cell, e.g. ``executor``) and, with ``plan``, its
    run plan and fingerprint. StudyError (one line naming the file and the cell) on the first
    bad value."""
    path, data, doc = read_file(path)
    sha = hashlib.sha256(data).hexdigest()
    root = Path(root)
    shared = {k: v for k, v in doc.items() if k != AXES_TABLE}
    for key in ROOT_KEYS:
        if key in shared:
            raise StudyError(
                f"{path}: `{key}` is set by the study (each cell's root is "
                "--root/cells/<name>); remove it from the file"
            )
    try:  # a bad shared key: named without a cell
        file_values(path, shared, sha, choices=_choices())
    except HallulogError as exc:
        raise StudyError(str(exc)) from None
    values = study_cell_values(str(path), doc.get(AXES_TABLE))
    cells: list[PlannedCell] = []
    for v in values:
        cell = make_cell(v, config=True)
        cells.append(PlannedCell(cell, _config(path, sha, shared, cell, root, overrides or {})))
    if plan:
        models: dict = {}
        cells = [_plan(path, pc, models) for pc in cells]
    axes = tuple(a for a in AXES if any(a in pc.cell.values for pc in cells))
    return StudyPlan(root, path, sha, axes, tuple(cells))


def write_cells(study: StudyPlan) -> Path:
    """Write each cell's run config (``configs/<name>.toml``, what ``run --config`` reads) and
    the study manifest; returns the manifest's path."""
    for pc in study.cells:
        target = study.root / (pc.cell.config or "")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".partial")
        tmp.write_text(dump_study(pc.config), encoding="utf-8")
        os.replace(tmp, target)
    return write_study(
        study.root,
        [pc.cell for pc in study.cells],
        axes=list(study.axes),
        source={"path": str(study.path), "sha256": study.sha256},
    )

"""A walk of the config through ``run`` (config → task → worker → store) visits each room once,
in order, without returning to the config: the config is resolved once into a run plan
(``config/plan.py``), and from then on the run reads the plan.

Checked twice: on the import graph (the rooms past the plan import nothing of the config but the
plan and the ``RunConfig`` type; the task, worker and store rooms nothing at all), and on a real
run against an instant backend, where no function of ``config/`` runs once the plan is built and
neither the plan nor a worker's spec carries a config.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import pickle
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from hallulog.config.plan import RunPlan
from hallulog.config.run_config import RunConfig

REPO = Path(__file__).resolve().parents[2]
#: the rooms a run passes through once its plan is built, and what they may import of config
PAST_THE_PLAN = ("orchestrator/run", "postrun", "estimate")
PLAN_MODULES = {"hallulog.config.plan", "hallulog.config.run_config"}
#: the rooms of the data's walk after the config: the task, the worker, the store (and the
#: servers the worker talks to): none imports the config
AFTER_THE_CONFIG = ("tasks", "workers", "storage", "backends", "serving")


def _config_imports(path: Path) -> set[str]:
    """The ``hallulog.config`` modules ``path`` imports (lazy imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        found |= {n for n in names if n == "hallulog.config" or n.startswith("hallulog.config.")}
    return found


def _modules(*folders: str) -> Iterator[Path]:
    for folder in folders:
        yield from sorted((REPO / folder).rglob("*.py"))


def test_the_rooms_past_the_plan_read_the_plan_only():
    bad = {
        str(p.relative_to(REPO)): sorted(names - PLAN_MODULES)
        for p in _modules(*PAST_THE_PLAN)
        if (names := _config_imports(p)) - PLAN_MODULES
    }
    assert bad == {}


def test_the_task_worker_and_store_never_import_the_config():
    bad = {
        str(p.relative_to(REPO)): sorted(names)
        for p in _modules(*AFTER_THE_CONFIG)
        if (names := _config_imports(p))
    }
    assert bad == {}


def test_the_import_scan_sees_imports():
    assert _config_imports(REPO / "orchestrator" / "run" / "loop.py") >= PLAN_MODULES


def _values(obj, seen=None) -> Iterator[object]:
    """``obj`` and every value inside it (dataclass fields, mappings, sequences)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    yield obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        inner = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    elif isinstance(obj, Mapping):
        inner = [*obj.keys(), *obj.values()]
    elif isinstance(obj, (list, tuple, set, frozenset)):
        inner = list(obj)
    else:
        inner = []
    for value in inner:
        yield from _values(value, seen)


@pytest.mark.slow
def test_a_run_never_returns_to_the_config_after_its_plan(tmp_path, monkeypatch):
    from hallulog.orchestrator.run import loop, run

    from bench.instant_run import InstantFleet, write_task

    task = tmp_path / "task.jsonl"
    write_task(task, 6)
    plans: list[RunPlan] = []
    specs: list = []
    calls: list[str] = []
    real_plan, real_specs = loop.plan_run, loop._worker_specs

    def plan_run(*args, **kwargs):
        plans.append(real_plan(*args, **kwargs))
        return plans[-1]

    def worker_specs(*args):
        specs.extend(real_specs(*args))
        return specs[-len(specs) :]

    monkeypatch.setattr(loop, "plan_run", plan_run)
    monkeypatch.setattr(loop, "_worker_specs", worker_specs)
    config_dir = str(REPO / "config") + os.sep

    def profile(frame, event, arg):  # every Python call in this process and its threads
        if event == "call" and plans and frame.f_code.co_filename.startswith(config_dir):
            calls.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    with InstantFleet(tmp_path / "fleet") as fleet:
        config = RunConfig(
            artifact_root=tmp_path / "run",
            task_path=str(task),
            model=str(fleet.model),
            manage_servers=False,
            server_urls=tuple(fleet.urls),
            logging_profile="light",
            k_samples=1,
            max_tokens=fleet.answer_tokens,
            progress=False,
        )
        threading.setprofile(profile)
        sys.setprofile(profile)
        try:
            result = run(config)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
    assert result.complete and result.validation["ok"]
    assert len(plans) == 1 and specs
    assert calls == []  # nothing of config/ ran once the plan was built
    assert not any(isinstance(v, RunConfig) for v in _values(plans[0]))
    for spec in specs:  # what a worker process unpickles: nothing of the config
        assert not any(isinstance(v, (RunConfig, RunPlan)) for v in _values(spec))
        assert b"hallulog.config" not in pickle.dumps(spec)


def test_the_walk_check_sees_a_call_into_the_config():
    """The profile hook above catches a property of the config (what the run no longer
    calls), so its empty list means something."""
    calls: list[str] = []
    config_dir = str(REPO / "config") + os.sep

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(config_dir):
            calls.append(frame.f_code.co_name)

    config = RunConfig()
    sys.setprofile(profile)
    try:
        _ = config.profile
    finally:
        sys.setprofile(None)
    assert "profile" in calls

"""``--executor ray``: what the cluster must give (how many actors, each actor's resources)
and how each actor starts its server. The pool on those actors: ``orchestrator/run/ray_executor.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hallulog.backends.servers import server_command
from hallulog.config.plan import RunPlan
from hallulog.config.run_config import RunConfig
from hallulog.contracts.errors import HallulogError

__all__ = ["RayExecutorError", "plan_actors", "actor_options", "server_launch"]


class RayExecutorError(HallulogError):
    """The Ray cluster cannot run this job (unreachable, too small, root not shared)."""


def plan_actors(config: RunConfig, plan: RunPlan, resources: dict[str, float]) -> tuple[int, int]:
    """(actors, GPUs of the cluster) for ``plan`` on a cluster with ``resources``
    (``ray.cluster_resources()``), or a one-line :class:`RayExecutorError` when the cluster
    cannot hold them. Each actor takes the GPUs of one server (``plan.servers``) on a GPU
    cluster; the default count is as many actors as the cluster's GPUs hold."""
    cfg = config
    gpus = int(resources.get("GPU", 0))
    cpus = float(resources.get("CPU", 0))
    per = plan.servers.gpus_per_server
    if cfg.gpus and gpus == 0:
        raise RayExecutorError(
            f"--gpus {','.join(map(str, cfg.gpus))}: the Ray cluster at "
            f"{cfg.ray_address} has no GPUs (resources: CPU={cpus:g})"
        )
    sizes = (
        f"--tensor-parallel-size {cfg.tensor_parallel_size} x --pipeline-parallel-size "
        f"{cfg.pipeline_parallel_size}"
    )
    if gpus and gpus < per:
        raise RayExecutorError(
            f"{sizes} needs {per} GPUs per actor; the Ray cluster at {cfg.ray_address} has {gpus}"
        )
    count = cfg.ray_actors or (gpus // per if gpus else plan.worker_count)
    if gpus and count * per > gpus:
        what = "one per actor" if per == 1 else f"{per} per actor: {sizes}"
        raise RayExecutorError(
            f"--ray-actors {count} needs {count * per} GPUs ({what}); "
            f"the Ray cluster at {cfg.ray_address} has {gpus}"
        )
    need = count * cfg.ray_cpus_per_actor
    if need > cpus:
        raise RayExecutorError(
            f"{count} actor(s) x --ray-cpus-per-actor "
            f"{cfg.ray_cpus_per_actor:g} need {need:g} CPUs; the Ray "
            f"cluster at {cfg.ray_address} has {cpus:g}"
        )
    return count, gpus


def actor_options(config: RunConfig, plan: RunPlan, *, gpu: bool) -> dict[str, Any]:
    """``ray.remote(SlotActor).options(...)`` of every slot: its CPUs, and on a GPU cluster the
    GPUs of one server (tensor x pipeline parallel size; Ray gives them on one node and sets
    the actor's ``CUDA_VISIBLE_DEVICES``, which its server inherits)."""
    return dict(
        num_cpus=config.ray_cpus_per_actor,
        num_gpus=plan.servers.gpus_per_server if gpu else 0,
        max_restarts=0,
        max_task_retries=0,
        max_concurrency=4,
        scheduling_strategy="SPREAD",
    )


def server_launch(plan: RunPlan, cache_dir: Path, *, gpu: bool) -> dict[str, Any]:
    """How each actor starts its server (``SlotActor``'s ``launch``): the same command line as
    a local server of the plan (engine options and ``--engine-args`` included) with
    ``{python}``, ``{port}`` and ``{spool_dir}`` filled in on the node, its environment (what
    its backend adds on a node not known here), and ``gpus``: the GPUs the actor must see (0 on
    CPU)."""
    spec = plan.servers
    env: dict[str, str] = {"HALLULOG_CACHE_DIR": str(cache_dir), "PYTHONUNBUFFERED": "1"}
    command = server_command(spec, host="127.0.0.1", port=0, spool_dir="{spool_dir}")
    command[command.index("--port") + 1] = "{port}"
    env.update(spec.backend.actor_environment(cache_dir, gpu=gpu, ranks=spec.gpus_per_server))
    command = ["{python}" if part == sys.executable else part for part in command]
    return {
        "command": command,
        "env": env,
        "startup_timeout": spec.startup_timeout,
        "gpus": spec.gpus_per_server if gpu else 0,
    }

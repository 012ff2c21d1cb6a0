"""``--executor ray``: executor slots are Ray actors on an existing cluster, one per GPU (or per
``--ray-cpus-per-actor`` CPUs on a CPU cluster), each owning its server and a worker
(``workers.ray_actor.SlotActor``). The driver — this process — keeps what it keeps on one node:
the in-memory queue, the checkpoint, the status board, progress and post-run.

The loop talks to an executor through a small interface (:class:`RayPool` offers it, in the
shape of ``WorkerPool``, so today's loop drives it unchanged):

- ``start()``                  connect, check the cluster, start every slot (server + worker)
- ``submit(groups)``           queue groups; the pool dispatches them to slots with capacity
- ``next_event(timeout)``      the next worker event (started/done/failed/fatal), or None
- ``check_workers(_)``         prompt ids found committed on slots that were lost (done, not redone)
- ``in_flight``/``outstanding`` bookkeeping per slot / over the run
- ``close()`` / ``kill()``     stop cleanly / at once

Node loss: a poll or call that raises ``RayActorError`` (``ActorDiedError``,
``ActorUnavailableError``) marks the slot lost; the groups dispatched to it are re-queued unless
the slot's worker directory (on the shared filesystem) already holds their commit. Ray restarts
the actor (``--ray-max-restarts``) when capacity returns; the new incarnation rolls the same
``worker_{slot}`` back to its last commit before it works again. Committed rows win over Ray's
own state, which is not durable: a group is redone at most, never lost, and consolidation keeps
one commit per prompt — exactly-once holds. A crashed driver takes its actors with it (Ray ends a
job's actors with the job); rerunning the command resumes from the artifact root.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable

from contracts import layout
from contracts.jsonl import iter_rows
from contracts.prompt_group import PromptGroup
from orchestrator.config import RunConfig
from orchestrator.errors import HallulogError
from orchestrator.manifest import update_manifest
from orchestrator.run.servers import ModelInfo, embedded_server_command
from workers.ray_actor import PROBE_NAME, SlotActor
from workers.worker import WorkerSpec

__all__ = ["RayPool", "RayExecutorError", "connect"]

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
_POLL_WAIT = 0.5
_RESTART_RETRY = 2.0


def _restart_exhausted(exc: Exception) -> bool:
    """True when Ray will not bring the actor back (restarts used up, or killed for good)."""
    from ray.exceptions import ActorUnavailableError

    return not isinstance(exc, ActorUnavailableError)


class RayExecutorError(HallulogError):
    """The Ray cluster cannot run this job (unreachable, too small, root not shared)."""


def connect(address: str, *, num_cpus: int | None = None) -> bool:
    """``ray.init`` for ``--ray-address``; True when this process started the Ray instance
    (``local``). Raises :class:`RayExecutorError` with one line naming the cause."""
    try:
        import ray
    except ImportError:
        raise RayExecutorError("--executor ray needs Ray: pip install 'ray[default]'") from None
    runtime_env = {"env_vars": {"PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}}
    if ray.is_initialized():
        return False
    if address == "local":
        ray.init(num_cpus=num_cpus, include_dashboard=False, runtime_env=runtime_env,
                 log_to_driver=False)
        return True
    if address != "auto" and not address.startswith("ray://"):
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
        except (OSError, ValueError) as exc:
            raise RayExecutorError(f"--ray-address {address}: no Ray cluster reachable there "
                                   f"({exc.__class__.__name__}: {exc})") from None
    try:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
    except Exception as exc:  # ConnectionError, RuntimeError, ...: one line, the cause
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RayExecutorError(f"--ray-address {address}: cannot connect to a Ray cluster "
                               f"({first})") from None
    return False


class RayPool:
    """Executor slots on Ray actors; ``WorkerPool``'s interface (see the module docstring)."""

    def __init__(self, config: RunConfig, model: ModelInfo, layer_ids: list[int], root: Path,
                 cache_dir: Path, *, worker_spec: Callable[[int], WorkerSpec]) -> None:
        self.config = config
        self.model = model
        self.layer_ids = layer_ids
        self.root = Path(root)
        self.cache_dir = cache_dir
        self._worker_spec = worker_spec
        self.specs: dict[int, WorkerSpec] = {}
        self.actors: dict[int, Any] = {}
        self.in_flight: dict[int, set[str]] = {}
        self.outstanding: set[str] = set()
        self.nodes: dict[int, str] = {}
        self._live: set[int] = set()
        self._dead: set[int] = set()
        self._queue: collections.deque[PromptGroup] = collections.deque()
        self._groups: dict[str, PromptGroup] = {}
        self._refs: dict[Any, tuple[str, int]] = {}
        self._events: collections.deque[dict[str, Any]] = collections.deque()
        self._recovered: list[str] = []
        self._restart_at: dict[int, float] = {}
        self._owns_ray = False
        self.stats = {"slots": 0, "slots_lost": 0, "groups_redone": 0,
                      "recovered_committed": 0, "restarts": 0}

    # -- start -------------------------------------------------------------------------------
    def start(self) -> None:
        import ray

        cfg = self.config
        self._owns_ray = connect(cfg.ray_address, num_cpus=cfg.ray_actors or cfg.num_workers)
        count, gpus = self._plan(ray.cluster_resources())
        probe = uuid.uuid4().hex
        (self.root / PROBE_NAME).write_text(probe, encoding="utf-8")
        launch = self._launch(gpu=gpus > 0)
        profile = cfg.profile
        recover = dict(storage_format=cfg.storage_format, layer_ids=self.layer_ids,
                       hidden_size=self.model.hidden_size, dtype=profile.dtype)
        actor_cls = ray.remote(SlotActor).options(
            num_cpus=cfg.ray_cpus_per_actor, num_gpus=1 if gpus else 0,
            max_restarts=cfg.ray_max_restarts, max_task_retries=0, max_concurrency=4,
            scheduling_strategy="SPREAD")
        for slot in range(count):
            spec = self._worker_spec(slot)
            self.specs[slot] = spec
            self.in_flight[slot] = set()
            self.actors[slot] = actor_cls.remote(slot, spec, launch, str(self.root), probe,
                                                 recover)
        self.stats["slots"] = count
        starts = {self.actors[s].start.remote(): s for s in range(count)}
        timeout = cfg.server_startup_timeout + 120
        ready, pending = ray.wait(list(starts), num_returns=len(starts), timeout=timeout)
        if pending:
            self.kill()
            raise RayExecutorError(
                f"{len(pending)} of {count} Ray actor(s) did not start within {timeout:.0f} s "
                "(not enough free resources on the cluster, or servers slow to load)")
        for ref in ready:
            self._started(starts[ref], ref, first=True)
        log.info("ray executor: %d slot(s) on %d node(s): %s", count,
                 len(set(self.nodes.values())), self.nodes)

    def _plan(self, resources: dict[str, float]) -> tuple[int, int]:
        """(actors, GPUs per cluster) — or a one-line error when the cluster cannot hold them."""
        cfg = self.config
        gpus = int(resources.get("GPU", 0))
        cpus = float(resources.get("CPU", 0))
        if cfg.gpus and gpus == 0:
            raise RayExecutorError(f"--gpus {','.join(map(str, cfg.gpus))}: the Ray cluster at "
                                   f"{cfg.ray_address} has no GPUs (resources: CPU={cpus:g})")
        count = cfg.ray_actors or (gpus if gpus else cfg.num_workers)
        if gpus and count > gpus:
            raise RayExecutorError(f"--ray-actors {count} needs {count} GPUs (one per actor); "
                                   f"the Ray cluster at {cfg.ray_address} has {gpus}")
        need = count * cfg.ray_cpus_per_actor
        if need > cpus:
            raise RayExecutorError(f"{count} actor(s) x --ray-cpus-per-actor "
                                   f"{cfg.ray_cpus_per_actor:g} need {need:g} CPUs; the Ray "
                                   f"cluster at {cfg.ray_address} has {cpus:g}")
        return count, gpus

    def _launch(self, gpu: bool) -> dict[str, Any]:
        cfg, model = self.config, self.model
        env: dict[str, str] = {"HALLULOG_CACHE_DIR": str(self.cache_dir), "PYTHONUNBUFFERED": "1"}
        if cfg.backend == "vllm":
            from orchestrator.run.vllm_backend import vllm_server_command, vllm_server_env

            command = vllm_server_command(model.path, host="127.0.0.1", port=0,
                                          layer_ids=self.layer_ids, spool_dir="{spool_dir}",
                                          dtype=cfg.model_dtype, served_model_name=model.name)
            env.update(vllm_server_env({}, gpu=0 if gpu else None, cache_dir=self.cache_dir))
            if gpu:
                env.pop("CUDA_VISIBLE_DEVICES")  # Ray's assignment to the actor stands
            command = ["{port}" if part == "0" and prev == "--port" else part
                       for prev, part in zip([""] + command, command)]
        else:
            command = embedded_server_command(model.path, host="127.0.0.1", port=0,
                                              spool_dir=Path("{spool_dir}"),
                                              dtype=cfg.model_dtype, layer_ids=self.layer_ids,
                                              served_model_name=model.name)
            command[command.index("--port") + 1] = "{port}"
        command = ["{python}" if part == sys.executable else part for part in command]
        return {"command": command, "env": env, "startup_timeout": cfg.server_startup_timeout}

    def _started(self, slot: int, ref: Any, *, first: bool) -> None:
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        try:
            info = ray.get(ref)
        except RayTaskError as exc:
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            self.kill()
            raise RayExecutorError(f"slot {slot}: {type(cause).__name__}: "
                                   f"{str(cause).splitlines()[0] if str(cause) else ''}") from None
        except RayActorError as exc:
            if first:
                self.kill()
                raise RayExecutorError(f"slot {slot}: actor died while starting "
                                       f"({type(exc).__name__})") from None
            if _restart_exhausted(exc):
                self._give_up(slot, exc)
            else:  # still restarting (e.g. waiting for capacity): ask again a bit later
                self._restart_at[slot] = time.monotonic() + _RESTART_RETRY
            return
        self.nodes[slot] = info["node"]
        self.specs[slot] = WorkerSpec(**{**self.specs[slot].__dict__, "server_url": info["url"]})
        self._live.add(slot)
        if not first:
            self.stats["restarts"] += 1
            log.warning("ray executor: slot %d is back (node %s)", slot, info["node"])
        self._poll(slot)
        self._dispatch()

    # -- queue and dispatch ------------------------------------------------------------------
    def submit(self, groups: Iterable[PromptGroup]) -> None:
        for group in groups:
            self._groups[group.prompt_id] = group
            self.outstanding.add(group.prompt_id)
            self._queue.append(group)
        self._dispatch()

    def _dispatch(self) -> None:
        per_slot = self.config.groups_in_flight
        for slot in sorted(self._live, key=lambda s: len(self.in_flight[s])):
            room = per_slot - len(self.in_flight[slot])
            batch = [self._queue.popleft() for _ in range(min(room, len(self._queue)))]
            if batch:
                self.in_flight[slot].update(g.prompt_id for g in batch)
                self.actors[slot].submit.remote(batch)

    def _poll(self, slot: int) -> None:
        self._refs[self.actors[slot].poll.remote(_POLL_WAIT)] = ("poll", slot)

    # -- events --------------------------------------------------------------------------------
    def next_event(self, timeout: float) -> dict[str, Any] | None:
        import ray
        from ray.exceptions import RayActorError

        deadline = time.monotonic() + timeout
        while not self._events:
            self._restart_due()
            left = deadline - time.monotonic()
            if self._restart_at and not self._refs:  # only restarts pending: wait for them
                time.sleep(max(0.0, min(left, min(self._restart_at.values()) - time.monotonic())))
                continue
            if left <= 0 or not self._refs:
                if not self._refs and self._queue:
                    raise RayExecutorError("every Ray actor is lost and none can be restarted; "
                                           "committed work is kept: rerun to resume")
                return None
            ready, _ = ray.wait(list(self._refs), num_returns=1, timeout=left)
            for ref in ready:
                kind, slot = self._refs.pop(ref)
                if kind == "start":
                    self._started(slot, ref, first=False)
                    continue
                try:
                    events = ray.get(ref)
                except RayActorError as exc:
                    self._lost(slot, exc)
                    continue
                for event in events:
                    self._book(slot, event)
                self._poll(slot)
        return self._events.popleft()

    def _book(self, slot: int, event: dict[str, Any]) -> None:
        kind, pid = event["event"], event.get("prompt_id")
        if kind in ("done", "failed"):
            self.in_flight[slot].discard(pid)
            self.outstanding.discard(pid)
        elif kind == "requeue":
            self.in_flight[slot].discard(pid)
            self._queue.appendleft(self._groups[pid])
        elif kind == "exited":
            return
        self._events.append(event)
        self._dispatch()

    def _lost(self, slot: int, exc: Exception) -> None:
        import ray
        from ray.exceptions import ActorDiedError

        self._live.discard(slot)
        self.stats["slots_lost"] += 1
        if not isinstance(exc, ActorDiedError):  # maybe alive but cut off: no zombie writer
            ray.kill(self.actors[slot], no_restart=False)
        committed = {row.get("prompt_id") for row in
                     iter_rows(layout.worker_dir(self.root, slot) / layout.PROMPT_INDEX,
                               malformed="skip")}
        lost = sorted(self.in_flight[slot])
        self.in_flight[slot] = set()
        redo = [pid for pid in lost if pid not in committed]
        for pid in lost:
            if pid in committed:
                self._recovered.append(pid)
                self.outstanding.discard(pid)
        for pid in reversed(redo):
            self._queue.appendleft(self._groups[pid])
        self.stats["groups_redone"] += len(redo)
        self.stats["recovered_committed"] += len(lost) - len(redo)
        log.error("ray executor: slot %d on node %s lost (%s); %d group(s) re-queued, %d found "
                  "committed; Ray restarts it when capacity returns", slot,
                  self.nodes.get(slot), type(exc).__name__, len(redo), len(lost) - len(redo))
        self._refs[self.actors[slot].start.remote()] = ("start", slot)
        self._dispatch()

    def _restart_due(self) -> None:
        now = time.monotonic()
        for slot, at in list(self._restart_at.items()):
            if at <= now:
                del self._restart_at[slot]
                self._refs[self.actors[slot].start.remote()] = ("start", slot)

    def _give_up(self, slot: int, exc: Exception) -> None:
        self._dead.add(slot)
        log.error("ray executor: slot %d is gone for good (%s)", slot, type(exc).__name__)

    def check_workers(self, committed_in: Callable[[int], set[str]] | None = None) -> list[str]:
        """Prompt ids of lost slots that turned out committed (they count as done)."""
        out, self._recovered = self._recovered, []
        return out

    def kill_workers(self, worker_ids: Iterable[int]) -> None:  # no local servers to restart
        return None

    # -- stop ----------------------------------------------------------------------------------
    def close(self, timeout: float = 120.0) -> None:
        import ray

        stops = [self.actors[s].stop.remote() for s in sorted(self._live)]
        if stops:
            ray.wait(stops, num_returns=len(stops), timeout=timeout)
        self._record()
        self.kill()

    def kill(self) -> None:
        try:
            import ray
        except ImportError:
            return
        for actor in self.actors.values():
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already gone
                pass
        self.actors = {}
        (self.root / PROBE_NAME).unlink(missing_ok=True)
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()

    def _record(self) -> None:
        try:
            update_manifest(self.root, executor={"kind": "ray", "address": self.config.ray_address,
                                                 "nodes": {str(k): v for k, v in
                                                           self.nodes.items()},
                                                 **self.stats})
        except HallulogError:
            log.exception("could not record the executor's figures in the manifest")

"""``--executor ray``: the worker pool's slots are Ray actors on an existing cluster, one per
``--tensor-parallel-size`` x ``--pipeline-parallel-size`` GPUs (one GPU by default; per
``--ray-cpus-per-actor`` CPUs on a CPU cluster), each owning its server and a worker
(``hallulog.workers.ray_actor.SlotActor``). The driver, this process, keeps what it keeps on one node:
the in-memory queue, dispatch by free slot, retries, the checkpoint and ``completions.log``, the
status board, progress and post-run. :func:`ray_pool` is a :class:`~hallulog.orchestrator.run.pool.WorkerPool`
on :class:`ActorSlots` (the worker-slot interface of ``hallulog.orchestrator.run.slots`` with actors in
place of processes), so the run loop's ``Drive`` drives it unchanged.

Per actor the driver keeps one ``start`` or ``poll`` call outstanding and waits on them all with
``ray.wait`` (the pipes and sentinels of the local pool). A slot gets its ``groups_in_flight``
free slots only once its actor has started (server healthy), so no group waits on an actor that
Ray cannot place yet.

Node loss: a call that raises ``RayActorError`` (the node went away, the actor died) or a slot
silent past the hang deadline is a dead worker, as on one node: the actor is killed for good, its
worker directory (on the shared filesystem) is rolled back to its last commit by
``recover_worker_dir``, its in-flight groups that were not committed go back to the queue, and a
new actor for the same slot and ``worker_{slot}`` directory is created; Ray places it when the
cluster has capacity (``--ray-max-restarts`` deaths in a row retire the slot). Committed rows win
over Ray's own state, which is not durable: a group is redone at most, never lost, and
consolidation keeps one commit per prompt. A crashed driver takes its actors with it (Ray ends a
job's actors with the job); rerunning the command resumes from the artifact root.

On an ``s3://`` root (``remote``, ``cli/bucket_run.py``) the nodes share only the
bucket: the driver's root is its own staging root, which no actor reads or writes; each actor
stages its worker directory on its node and ships it (``remote/actor_shipping.py``), reporting a
group done once its segment is in the bucket. A lost slot's committed groups are then those of
its segment chain, read after the driver has fenced it (``remote/restore.py``), so
nothing the lost actor still ships can count.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hallulog.config.plan import RunPlan
from hallulog.config.run_config import RunConfig
from hallulog.contracts.errors import HallulogError
from hallulog.contracts.extras import require
from hallulog.contracts.run_manifest import RunManifest
from hallulog.orchestrator.run.pool import WorkerPool
from hallulog.orchestrator.run.ray_bucket import BucketSlots
from hallulog.orchestrator.run.ray_plan import (
    RayExecutorError,
    actor_options,
    plan_actors,
    server_launch,
)
from hallulog.orchestrator.run.slots import Notice, WorkerSlot
from hallulog.workers.ray_actor import PROBE_NAME, SlotActor
from hallulog.workers.worker import WorkerSpec

__all__ = [
    "ray_pool",
    "ActorSlots",
    "RayExecutorError",
    "connect",
    "plan_actors",
    "actor_options",
    "server_launch",
]

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
POLL_WAIT = 0.5
"""Seconds an actor's ``poll`` waits for a first event before answering empty."""


def connect(address: str, *, num_cpus: int | None = None) -> bool:
    """``ray.init`` for ``--ray-address``; True when this process started the Ray instance
    (``local``). Raises :class:`RayExecutorError` with one line naming the cause."""
    ray = require("ray", "--executor ray")
    runtime_env = {
        "env_vars": {
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])
            )
        }
    }
    if ray.is_initialized():
        return False
    if address == "local":
        ray.init(
            num_cpus=num_cpus, include_dashboard=False, runtime_env=runtime_env, log_to_driver=False
        )
        return True
    if address != "auto" and not address.startswith("ray://"):
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
        except (OSError, ValueError) as exc:
            raise RayExecutorError(
                f"--ray-address {address}: no Ray cluster reachable there "
                f"({exc.__class__.__name__}: {exc})"
            ) from None
    try:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
    except Exception as exc:  # ConnectionError, RuntimeError, ...: one line, the cause
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RayExecutorError(
            f"--ray-address {address}: cannot connect to a Ray cluster ({first})"
        ) from None
    return False


def ray_pool(
    config: RunConfig,
    plan: RunPlan,
    root: Path,
    cache_dir: Path,
    *,
    worker_spec: Callable[[int], WorkerSpec],
    committed_in: Callable[[int], set[str]],
    hang_seconds: float | None,
    remote: Any = None,
) -> WorkerPool:
    """The pool of ``--executor ray``: ``WorkerPool``'s bookkeeping, dispatch and death handling
    on :class:`ActorSlots` (see the module docstring).

    ``worker_spec(slot)`` gives each slot's spec; ``committed_in`` and ``hang_seconds`` are the
    local pool's (on a bucket root, ``remote``, the slots' own ``committed_in`` reads the bucket).
    It connects to the cluster and checks that it can hold the actors.
    """
    ray = require("ray", "--executor ray")
    owns_ray = connect(config.ray_address, num_cpus=config.ray_actors or plan.worker_count)
    try:
        count, gpus = plan_actors(config, plan, ray.cluster_resources())
        slots = ActorSlots(
            config,
            plan,
            root,
            cache_dir,
            gpu=gpus > 0,
            count=count,
            owns_ray=owns_ray,
            remote=remote,
        )
    except BaseException:
        if owns_ray and ray.is_initialized():
            ray.shutdown()
        raise
    return WorkerPool(
        [worker_spec(slot) for slot in range(count)],
        committed_in=committed_in if remote is None else slots.committed_in,
        max_restarts=config.ray_max_restarts,
        hang_seconds=hang_seconds,
        slots=slots,
    )


class ActorSlots:
    """The :class:`~hallulog.orchestrator.run.slots.WorkerSlots` of ``--executor ray``: each worker is a
    ``SlotActor`` (its own server and a worker), called instead of piped to.

    Per actor one ``start`` or ``poll`` call is outstanding; :meth:`wait` waits on them all with
    ``ray.wait``. A slot takes groups once its actor has started (server healthy). The
    executor's figures (``stats``, the ``nodes`` the slots ran on) go into the manifest at
    :meth:`close`.
    """

    def __init__(
        self,
        config: RunConfig,
        plan: RunPlan,
        root: Path,
        cache_dir: Path,
        *,
        gpu: bool,
        count: int,
        owns_ray: bool,
        remote: Any = None,
    ) -> None:
        import ray

        self.config, self.root = config, Path(root)
        self._owns_ray = owns_ray
        self._refs: dict[Any, tuple[str, int, int]] = {}  # ref → (call, slot, generation)
        self._started: set[int] = set()
        self._causes: dict[int, str] = {}
        self.nodes: dict[int, str] = {}
        self.stats = {
            "slots": count,
            "slots_lost": 0,
            "groups_redone": 0,
            "recovered_committed": 0,
            "restarts": 0,
        }
        self._probe = uuid.uuid4().hex
        self._remote = BucketSlots(remote, self.root, self._probe) if remote else None
        if self._remote is None:
            (self.root / PROBE_NAME).write_text(self._probe, encoding="utf-8")
        self._launch = server_launch(plan, cache_dir, gpu=gpu)
        self._recover = dict(
            storage_format=plan.storage_format,
            layer_ids=list(plan.stored.layer_ids),
            hidden_size=plan.model.hidden_size,
            dtype=plan.stored.dtype,
        )
        self._actor_cls = ray.remote(SlotActor).options(**actor_options(config, plan, gpu=gpu))

    def spawn(self, slot: WorkerSlot) -> bool:
        """Create the slot's actor; it takes groups once its ``start`` call has returned."""
        wid = slot.spec.worker_id
        slot.proc = self._actor_cls.remote(
            wid,
            slot.spec,
            self._launch,
            "" if self._remote else str(self.root),  # a bucket root: nothing of the driver's
            self._probe,
            self._recover,
            self._remote.actor_options if self._remote else None,
        )
        slot.conn = None
        self._started.discard(wid)
        self._refs[slot.proc.start.remote()] = ("start", wid, slot.generation)
        return False

    def send(self, slot: WorkerSlot, group: Any) -> None:
        slot.proc.submit.remote([group])  # a dead actor shows in its next poll

    def committed_in(self, wid: int) -> set[str]:
        """On a bucket root: the prompts the slot's segment chain commits, read once it is
        fenced (the pool's ``committed_in``)."""
        return self._remote.committed_in(wid)

    def kill(self, slot: WorkerSlot) -> None:
        _kill_actor(slot.proc)  # its outstanding call fails: handled as a death

    def reap(self, slot: WorkerSlot) -> str:
        """The actor is gone or going: make sure (a node cut off may still run it)."""
        _kill_actor(slot.proc)
        self._started.discard(slot.spec.worker_id)
        slot.proc = None
        return self._causes.pop(slot.spec.worker_id, "killed")

    def wait(self, slots: dict[int, WorkerSlot], timeout: float) -> list[Notice]:
        import ray
        from ray.exceptions import RayError, RayTaskError

        ready: list[Any] = []
        if self._refs:
            ready, _ = ray.wait(list(self._refs), num_returns=1, timeout=timeout)
            if ready:  # and every other one ready by now
                ready, _ = ray.wait(list(self._refs), num_returns=len(self._refs), timeout=0)
        elif timeout:
            time.sleep(timeout)
        notices: list[Notice] = []
        dead: set[int] = set()
        for ref in ready:
            call, wid, generation = self._refs.pop(ref)
            w = slots[wid]
            if generation != w.generation or w.proc is None or wid in dead:
                continue  # a call to an actor since replaced
            try:
                value = ray.get(ref)
            except RayError as exc:
                if call == "start" and generation == 1 and isinstance(exc, RayTaskError):
                    raise RayExecutorError(f"slot {wid}: {_one_line(exc)}") from None
                self._causes[wid] = type(exc).__name__  # the pool's "exit code"
                log.error(
                    "ray executor: slot %d on node %s lost: %s: %s",
                    wid,
                    self.nodes.get(wid, "(not placed)"),
                    type(exc).__name__,
                    _one_line(exc),
                )
                dead.add(wid)
                notices.append((wid, "dead", None))
                continue
            if call == "start":
                self._on_started(wid, generation, value)
                notices.append((wid, "started", None))
            else:
                notices.extend((wid, "event", event) for event in value)
            self._refs[w.proc.poll.remote(POLL_WAIT)] = ("poll", wid, w.generation)
        return notices

    def _on_started(self, wid: int, generation: int, info: dict[str, Any]) -> None:
        self.nodes[wid] = info["node"]
        self._started.add(wid)
        if generation > 1:
            self.stats["restarts"] += 1
            log.warning("ray executor: slot %d is back on node %s", wid, info["node"])
        else:
            log.info(
                "ray executor: slot %d on node %s, server %s%s",
                wid,
                info["node"],
                info["url"],
                f", GPUs {info['devices']}" if info.get("devices") else "",
            )

    def observe(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            if event["event"] == "worker_died" and not event["expected"]:
                self.stats["slots_lost"] += 1
                self.stats["groups_redone"] += event["requeued"]
            elif event["event"] == "recovered":
                self.stats["recovered_committed"] += 1

    def waiting(self, slots: dict[int, WorkerSlot]) -> list[str]:
        return [
            f"slot {wid} waits for Ray to place and start it"
            for wid, w in slots.items()
            if w.proc is not None and wid not in self._started
        ]

    # ---- shutdown ----------------------------------------------------------------------------

    def close(self, slots: dict[int, WorkerSlot], timeout: float) -> None:
        """Let the started actors finish and stop their servers (bounded), record the
        executor's figures in the manifest, then end every actor."""
        import ray

        stops = [
            slots[wid].proc.stop.remote()
            for wid in sorted(self._started)
            if slots[wid].proc is not None
        ]
        if stops:
            ray.wait(stops, num_returns=len(stops), timeout=timeout)
        try:
            RunManifest.require(self.root).replace(
                executor={
                    "kind": "ray",
                    "address": self.config.ray_address,
                    "nodes": {str(k): v for k, v in self.nodes.items()},
                    **self.stats,
                },
            ).dump(self.root)
        except HallulogError:
            log.exception("could not record the executor's figures in the manifest")
        if self._remote is not None:  # what the actors staged is in the bucket now
            self._remote.drop_node_staging()
        self.kill_all(slots)

    def kill_all(self, slots: dict[int, WorkerSlot]) -> None:
        """End every actor at once (and the Ray instance this process started)."""
        try:
            import ray
        except ImportError:
            return
        for w in slots.values():
            if w.proc is not None:
                _kill_actor(w.proc)
                w.proc = None
        self._started.clear()
        self._refs.clear()
        if self._remote is None:
            (self.root / PROBE_NAME).unlink(missing_ok=True)
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()


def _kill_actor(actor: Any) -> None:
    import ray

    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # already gone
        pass


def _one_line(exc: BaseException) -> str:
    """The cause of a Ray error in one line (a task error's own exception when it has one)."""
    cause = getattr(exc, "cause", None) or exc
    text = str(cause).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(cause).__name__}: {first}" if cause is not exc else (first or type(exc).__name__)

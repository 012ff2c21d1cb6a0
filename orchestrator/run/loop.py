"""The run's lifecycle: plan → servers → workers → drain the queue → consolidate.

One function, ``run(config)``, drives it: it resolves the config into a run plan once
(``config/plan.py``: the task and its prompt ids, what is stored, the servers, the manifest) and
from then on reads the plan; the pieces live in their own modules (checkpoint, servers, fleet,
pool, dispatch, status).
"""

from __future__ import annotations

import copy
import logging
import os
import signal
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Iterator
from typing import Any

from hallulog.orchestrator.run.checkpoint import (CheckpointWriter, CompletionLog, load_completed,
                                                  read_completion_log, write_completed)
from hallulog.config.plan import RunPlan, plan_run, plan_task
from hallulog.config.run_config import RunConfig
from hallulog.contracts import layout
from hallulog.contracts.jsonl import truncate_to
from hallulog.contracts.layout import worker_dir, worker_dirs
from hallulog.contracts.prompt_group import PromptGroup
from hallulog.contracts.root_lock import holds_root
from hallulog.contracts.errors import ConfigError, HallulogError
from hallulog.contracts.run_manifest import RunManifest, check_resumable
from hallulog.postrun.labels import label_counts, label_with_judge, unlabeled_prompts
from hallulog.evaluation import report_path
from hallulog.orchestrator.run.budget import preflight
from hallulog.orchestrator.run.dispatch import Drive
from hallulog.orchestrator.run.pool import WorkerPool
from hallulog.orchestrator.run.progress import Progress
from hallulog.backends.models import hallulog_cache_dir, remote_model, resolve_model
from hallulog.backends.servers import ServerProcess, remove_spools, start_servers
from hallulog.orchestrator.run.status import StatusBoard
from hallulog.orchestrator.run.supervision import Supervision
from hallulog.postrun.finish import finish
from hallulog.tasks import TaskStream
from hallulog.tasks.base import MalformedCollector
from hallulog.tasks.grading import needs_judge_for
from hallulog.workers.persist import recover_worker_dir
from hallulog.workers.worker import WorkerSpec

__all__ = ["run", "RunResult"]

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    """What a run did (the CLI prints it; tests assert on it)."""

    artifact_root: Path
    total: int
    done_before: int
    done: int = 0
    failed: list[str] = field(default_factory=list)
    capture_errors: int = 0
    """Samples of committed groups whose activations could not be captured."""
    capture_reasons: dict[str, int] = field(default_factory=dict)
    """Of those, the ones whose rows failed the check, per reason (``capture_zeros`` …)."""
    wall_seconds: float = 0.0
    labels: dict[str, int] = field(default_factory=dict)
    judge: dict[str, Any] | None = None
    consolidation: dict[str, Any] | None = None
    exports: dict[str, int] | None = None
    validation: dict[str, Any] | None = None
    positions_missing: dict[str, int] = field(default_factory=dict)
    """With --positions: per name, the stored generations (of this session) it does not exist
    for (``slt`` of a one-token answer, ``exact_answer`` without a span; docs/alignment.md)."""

    @property
    def complete(self) -> bool:
        return self.done_before + self.done >= self.total


class _Stop(KeyboardInterrupt):
    """SIGTERM received: shut down cleanly, like Ctrl-C (committed work is kept)."""


def _raise_stop(signum, frame):  # noqa: ARG001
    raise _Stop()


@holds_root("run")  # one writer per root (contracts/root_lock.py)
def run(config: RunConfig, *, only: set[str] | None = None, redo: set[str] | None = None,
        remote: Any = None) -> RunResult:
    """Run (or resume) the whole job described by ``config``.

    ``only`` restricts the work to these prompt ids; ``redo`` reprocesses these even when they
    were committed before (``hallulog retry``: the new commit supersedes the old one).
    ``remote``: the bucket of an ``s3://`` root (``hallulog.cli.bucket_run.RemoteTarget``; the
    root is then the staging root): the actors of ``--executor ray`` ship to it, and the post-run
    is ``remote_run``'s, after the run.
    """
    started = time.monotonic()
    root = Path(config.artifact_root)
    root.mkdir(parents=True, exist_ok=True)
    cache_dir = hallulog_cache_dir(config.cache_dir)

    task = plan_task(config)  # the groups themselves are read again as dispatched
    if not task.prompt_ids:
        raise HallulogError(f"task {config.task} ({task.stream.source}) has no prompts")
    model = resolve_model(config.model, cache_dir) if config.manage_servers \
        else remote_model(config.server_urls[0], config.model, cache_dir)
    try:  # --layers is checked against the model here, before any server starts
        plan = plan_run(config, model, task)
    except ConfigError as exc:
        raise HallulogError(str(exc)) from None
    # from here on the plan holds every derived value: nothing calls back into the config
    stream, answer_kind, all_ids = task.stream, task.answer_kind, task.prompt_ids
    fresh = copy.deepcopy(dict(plan.manifest))
    existing = RunManifest.load(root)
    if existing is not None:
        if not config.resume:
            raise HallulogError(f"{root} already holds run {existing.get('run_id')}; "
                                "resume it (drop --resume false), or pick another --artifact-root")
        check_resumable(existing, fresh)
        fresh["run_id"] = existing["run_id"]
        fresh["timestamp"] = existing.get("timestamp", fresh["timestamp"])
        fresh["resumed_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    RunManifest(fresh).dump(root)
    run_id = fresh["run_id"]

    completed = _reconcile(root, plan, run_id)
    completed -= redo or set()
    def wanted(prompt_id: str) -> bool:
        return prompt_id not in completed and (only is None or prompt_id in only)

    pending = sum(1 for pid in all_ids if wanted(pid))
    done_before = len(all_ids & completed)
    total = len(all_ids)
    result = RunResult(artifact_root=root, total=total, done_before=done_before)
    # the storage budget of the pending prompts, before any server starts (run.budget)
    meter = preflight(config, plan, root, pending=pending) if pending else None

    board = StatusBoard(run_id=run_id, config_summary=_summary(config, plan),
                        fingerprint=fresh["config_fingerprint"], artifact_root=str(root),
                        total_prompts=total, skipped=done_before,
                        k_samples=config.k_samples)
    board.set_evaluation_report(report_path(root))  # an earlier evaluate of a resumed root
    # teardown: one stack, unwound in reverse order of registration (pool, fleet, servers,
    # spools, checkpoint, completions log, status API), on success and on any error alike
    with ExitStack() as stack:
        api = _start_api(config, board)
        if api is not None:
            stack.callback(api.stop)
        completions = CompletionLog(root)
        stack.callback(completions.close)
        checkpoint = CheckpointWriter(root, run_id)
        close_checkpoint = _Once(lambda: checkpoint.close(final=completed))
        stack.callback(close_checkpoint)
        stack.callback(remove_spools, root, config.spool_root)
        servers: list[ServerProcess] = []
        stack.callback(_stop_servers, servers)
        restore_sigterm = _Once(signal.signal, signal.SIGTERM,
                                signal.signal(signal.SIGTERM, _raise_stop))
        stack.callback(restore_sigterm)
        try:
            urls: list[str] = [None]  # type: ignore[list-item]
            judge = needs_judge_for(answer_kind, config.task) and bool(unlabeled_prompts(root)
                                                                      or pending)
            if (pending or judge) and config.executor == "local":
                board.set_phase("starting")
                started_servers, urls = start_servers(plan.servers, root, cache_dir, board,
                                                      wait=not pending)
                servers.extend(started_servers)
            if pending:
                if config.executor == "ray":  # slots on Ray actors, each with its own server
                    pool = _ray_pool(config, plan, root, cache_dir, remote)
                else:
                    pool = WorkerPool(_worker_specs(config, plan, root, urls),
                                      committed_in=_committed_in(root, plan),
                                      hang_seconds=_hang_seconds(config))
                supervision = Supervision(servers, pool, config, board)
                stack.callback(supervision.close, timeout=30)  # after the pool's kill, below
                kill_pool = _Once(pool.kill)
                stack.callback(kill_pool)
                stack.callback(supervision.stop_watching)
                stack.callback(restore_sigterm)  # first of all on an error, as before
                # read lazily, a group per free slot; the pool lets each go once it is resolved
                pool.submit(_pending_groups(stream, all_ids, wanted), count=pending)
                supervision.start()
                progress = Progress(total=result.total, initial=result.done_before,
                                    enabled=config.progress)
                close_progress = _Once(progress.close)
                stack.callback(close_progress)
                Drive(pool=pool, config=config, board=board, progress=progress,
                      completions=completions, snapshots=checkpoint, completed=completed,
                      result=result, fleet=supervision.fleet, watchdog=supervision.watchdog,
                      meter=meter).run()
                close_progress()
                supervision.stop_watching()
                pool.close()
                kill_pool.skip()
                supervision.close()
                urls = supervision.healthy_urls() or urls
            close_checkpoint()
            completions.reset()
            RunManifest.require(root).replace(
                completed_prompt_ids=sorted(completed),
                finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z")).dump(root)
            if judge:
                board.set_phase("labeling")
                result.judge = label_with_judge(root, task=config.task,
                                                judge_url=config.judge_url or urls[0],
                                                judge_model=config.judge_model or plan.model.name)
            _stop_servers(servers)
            if config.consolidate and result.complete and remote is None:  # else remote_run's
                done = finish(root, expected_prompt_ids=all_ids, on_step=board.set_phase)
                result.consolidation, result.exports, result.validation = \
                    done.consolidation, done.exports, done.validation
                if plan.stored.attention_features:  # docs/formats/attention.md
                    from hallulog.postrun.attention_gather import store_attention
                    board.set_phase("attention")
                    store_attention(root, plan.model.path,
                                    in_pass=plan.servers.backend.attention_in_pass)
            board.set_evaluation_report(report_path(root))
            board.set_phase("done")
        except BaseException:
            board.set_phase("failed")
            raise
    result.wall_seconds = time.monotonic() - started
    result.labels = label_counts(root)
    return result


class _Once:
    """``fn(*args)`` at the first call only: the normal path closes a part early, and the exit
    stack's call at the end is then a no-op (:meth:`skip` makes it one without a call)."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self._fn, self._args, self._done = fn, args, False

    def __call__(self) -> None:
        if not self._done:
            self._done = True
            self._fn(*self._args)

    def skip(self) -> None:
        self._done = True


def _stop_servers(servers: list[ServerProcess]) -> None:
    for server in servers:
        server.stop()


def _reconcile(root: Path, plan: RunPlan, run_id: str) -> set[str]:
    """Roll worker dirs back to their last commit; the data wins over the checkpoint
    (``completed_prompts.json`` and ``completions.log``), which is then rewritten from it."""
    from_data: set[str] = set()
    for wdir in worker_dirs(root):
        from_data |= _recover(wdir, plan)
    recorded = load_completed(root) | read_completion_log(root)
    if recorded != from_data:
        log.warning("the checkpoint lists %d prompt(s), the worker data %d: "
                    "using the data (%d only in the file, %d only in the data)",
                    len(recorded), len(from_data), len(recorded - from_data),
                    len(from_data - recorded))
    if from_data or recorded:
        write_completed(root, from_data, run_id)
    log_path = root / layout.COMPLETION_LOG
    if log_path.exists():  # the snapshot just written covers it
        truncate_to(log_path, 0)
    return from_data


def _recover(wdir: Path, plan: RunPlan) -> set[str]:
    return recover_worker_dir(wdir, storage_format=plan.storage_format,
                              layer_ids=list(plan.stored.layer_ids),
                              hidden_size=plan.model.hidden_size, dtype=plan.stored.dtype)


def _committed_in(root: Path, plan: RunPlan):
    def committed_in(worker_id: int) -> set[str]:
        return _recover(worker_dir(root, worker_id), plan)
    return committed_in


def _hang_seconds(config: RunConfig) -> float:
    """How long a worker may say nothing with groups in flight: generation and capture, each
    up to three attempts of ``--request-timeout``, plus a minute."""
    return 6 * config.request_timeout + 60.0


def _worker_specs(config: RunConfig, plan: RunPlan, root: Path, urls: list[str]
                  ) -> list[WorkerSpec]:
    stored = plan.stored
    return [WorkerSpec(
        worker_id=i, server_url=urls[i % len(urls)], model_name=plan.model.name,
        worker_dir=str(worker_dir(root, i)), storage_format=plan.storage_format,
        layer_ids=stored.layer_ids, hidden_size=plan.model.hidden_size,
        sequence_mode=stored.sequence_mode, dtype=stored.dtype, positions=stored.positions,
        capture_mode=stored.capture_mode, k_samples=config.k_samples,
        primary_temperature=config.primary_temperature,
        sample_temperature=config.sample_temperature, sample_top_p=config.sample_top_p,
        max_tokens=config.max_tokens, seed=config.seed, groups_in_flight=plan.groups_in_flight,
        request_timeout=config.request_timeout, commit_interval_ms=config.commit_interval_ms,
        check_captures=config.check_captures, driver_pid=os.getpid(),
        chat_template_kwargs=dict(plan.chat_template_kwargs) or None, reasoning=plan.reasoning,
        attention=stored.attention_features and plan.servers.backend.attention_in_pass,
    ) for i in range(plan.worker_count)]


def _ray_pool(config: RunConfig, plan: RunPlan, root: Path, cache_dir: Path, remote: Any = None):
    """The pool of ``--executor ray``: slots on Ray actors, each with its own server."""
    from dataclasses import replace

    from hallulog.orchestrator.run.ray_executor import ray_pool

    template = _worker_specs(config, plan, root, [""])[0]
    return ray_pool(config, plan, root, cache_dir,
                   worker_spec=lambda i: replace(template, worker_id=i, server_url=f"ray:slot-{i}",
                                                 worker_dir=str(worker_dir(root, i))),
                   committed_in=_committed_in(root, plan),
                   hang_seconds=_hang_seconds(config), remote=remote)


def _pending_groups(stream: TaskStream, ids: set[str], wanted: Callable[[str], bool]
                    ) -> Iterator[PromptGroup]:
    """The task's groups to run, read from the file again (its malformed lines were reported
    by the first reading)."""
    quiet = MalformedCollector(str(stream.source), stream.strict, quiet=True)
    for group in stream.groups(quiet):
        if group.prompt_id not in ids:
            raise HallulogError(f"{stream.source} changed during the run: prompt "
                                f"{group.prompt_id} was not in it at the start (committed work "
                                "is kept; rerun to resume on the file as it is now)")
        if wanted(group.prompt_id):
            yield group


def _summary(config: RunConfig, plan: RunPlan) -> dict[str, Any]:
    manifest, stored = plan.manifest, plan.stored
    return {"task": config.task, "model": plan.model.name, "backend": plan.servers.backend.name,
            "k_samples": config.k_samples, "logging_profile": manifest["logging_profile"],
            "target_layers": manifest["target_layers"], "sequence_mode": stored.sequence_mode,
            "dtype": stored.dtype, "num_layer_ids": len(stored.layer_ids),
            **({"positions": list(stored.positions)} if stored.positions else {}),
            "storage_format": plan.storage_format, "num_workers": plan.worker_count,
            "max_tokens": config.max_tokens}


def _start_api(config: RunConfig, board: StatusBoard):
    if config.status_port is None:
        return None
    from hallulog.api import StatusServer

    server = StatusServer(board.snapshot, config.status_host, config.status_port,
                          config.status_token)
    server.start()
    log.info("status API on http://%s:%d/", config.status_host, config.status_port)
    return server

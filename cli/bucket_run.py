"""``hallulog run --artifact-root s3://BUCKET/PREFIX``: a run whose durable root is a bucket.

The worker's commit protocol needs append, fsync, truncate and rename, which an object store
does not have, so the run writes a local staging root exactly as a local run does (commit
markers, recovery, rollback unchanged) and ships what it has committed as immutable segments
(``remote/segments.py``):

- **Resume.** The bucket is the truth: the staging root's worker directories are made the
  committed prefix the segments hold (``remote/restore.py``), ``run_manifest.json`` the
  copy the first session shipped, the checkpoint files removed; the usual local resume
  (recovery, reconcile) then runs. A node that lost its disk starts from an empty staging
  directory; the prompts in no segment are redone.
- **Shipping.** ``--executor local``: the driver ships every worker directory of its staging
  root every ``--checkpoint-interval`` seconds and once when the run stops
  (``remote/shipper.py``). ``--executor ray``: every actor stages its own worker
  directory on its node and ships it itself; it reports a group done only once the group's
  segment is in the bucket, so the driver never counts a commit a lost node takes with it
  (``orchestrator/run/ray_executor.py``, ``remote/actor_shipping.py``). At the start of each
  session the driver fences every worker's segment chain, so no actor of an earlier session
  ships after it.
- **Finish.** When the queue has drained, the staging root is the bucket's committed prefix
  (with Ray: restored once more from the segments), the usual post-run (consolidate, exports,
  validate) runs on it and the finished root is pushed (create-only, the file list last), where
  ``hallulog pull`` and the bucket readers read it.

One writer per prefix: the run holds the bucket's lease (``remote/lease.py``) for its
whole life, and every segment and the finished root's file list are shipped only while it does.

``retry`` is the same with only the prompts to redo; the CLI's entry for every command on a
bucket root is ``cli/bucket_commands.py``.
docs/object-storage.md.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from pathlib import Path

from hallulog.cli.bucket_staging import (
    held_staging,
    recover_worker_dirs,
    remove_staging,
    ship_finished,
    staging_dir_for,
)
from hallulog.config.plan import plan_task
from hallulog.contracts.errors import HallulogError, ResumeRefused
from hallulog.remote.client import Bucket, object_url
from hallulog.remote.compact import drop_segments
from hallulog.remote.lease import BucketLease, BucketLockLost, bucket_lock
from hallulog.remote.restore import fence_session, restore_staging
from hallulog.remote.segments import ROOT_CHAIN
from hallulog.remote.shipper import SegmentShipper

__all__ = ["run_remote", "report_run", "RemoteTarget", "ACTOR_SHIP_GAP"]

log = logging.getLogger(__name__)

ACTOR_SHIP_GAP = 1.0
"""With ``--executor ray``: the longest an actor holds a finished group before shipping it
(less when ``--checkpoint-interval`` is shorter; sooner when all its groups wait)."""


@dataclasses.dataclass(frozen=True)
class RemoteTarget:
    """What ``--executor ray`` needs of a bucket root: the URL, how often actors ship, and each
    worker chain's fence of this session (the segments from there on are this session's)."""

    url: str
    ship_gap: float
    since: dict[str, int]
    epoch: int = 0
    """The session's lease epoch: every segment its actors ship carries it."""


def run_remote(config, *, retry: bool = False):
    """``run(config)`` for an ``s3://`` artifact root: staging, segments, post-run, push.
    ``retry``: only the prompts ``hallulog retry`` redoes. Returns the run's ``RunResult``
    (its ``artifact_root`` the staging root) and the summary of the push (None when the run
    did not finish)."""
    from hallulog.remote.sync import read_tree_list

    url = object_url(config.artifact_root)
    bucket = Bucket(url)

    def refuse_finished() -> None:
        if read_tree_list(bucket) is not None:
            raise HallulogError(
                f"{url} already holds a finished root; read it with `hallulog pull "
                f"{url} DIR` or the bucket readers, or choose another prefix"
            )

    refuse_finished()  # before the lease: a refused command writes nothing
    staging = staging_dir_for(url, config.staging_dir, config.cache_dir)
    command = "retry" if retry else "run"
    with bucket_lock(bucket, command) as lease:  # one writer per prefix, on any node
        refuse_finished()  # pushed by the lease's previous holder
        explicit = config.staging_dir is not None
        # restoring rewrites the staging root: held, as a cache of the bucket's run
        with held_staging(url, staging, bucket, command, explicit=explicit):
            result, pushed = _run_staged(config, url, bucket, staging, retry, lease)
        if pushed is not None:  # every byte of the staging root is in the bucket
            remove_staging(staging, url)
        return result, pushed


def _retry_set(config, staging: Path, states) -> tuple[set[str] | None, set[str] | None]:
    """``(only, redo)`` of ``run``: what ``hallulog retry`` reprocesses, from the restored root."""
    from hallulog.postrun.repair import prompts_to_retry
    from hallulog.remote.segments import WorkerState, advance, chain_dir

    retry = prompts_to_retry(staging, plan_task(config).prompt_ids)
    for name, st in states.items():  # repair may set malformed lines aside: not on segments
        now, _, _, _ = advance(chain_dir(staging, name), WorkerState(name))
        if now.ends != st.ends:
            raise HallulogError(
                f"{object_url(config.artifact_root)}: {name} holds malformed lines; pull the "
                "root, run `hallulog retry` on the copy and push it to another prefix"
            )
    print(
        f"retrying {len(retry)} prompt(s): "
        + ", ".join(sorted(retry)[:10])
        + (" ..." if len(retry) > 10 else "")
    )
    return retry, retry


def _run_staged(config, url: str, bucket: Bucket, staging: Path, retry: bool, lease: BucketLease):
    from hallulog.orchestrator.run import run
    from hallulog.postrun.finish import finish

    ray = config.executor == "ray"
    # a new session: every chain fenced at its next number, then this epoch recorded; no
    # segment an earlier holder ships from now on is ever restored (remote/epochs.py)
    workers = [f"worker_{i}" for i in range(config.num_workers or 0)]
    since = fence_session(
        bucket, lease.epoch, "retry" if retry else "run", workers, guard=lease.check
    )
    states = restore_staging(staging, bucket)
    only = redo = None
    if retry:
        only, redo = _retry_set(config, staging, states)
    local = dataclasses.replace(config, artifact_root=staging)  # its manifest records it
    # one node: the driver ships every chain; Ray: the actors their own, the driver the root's
    shipper = SegmentShipper(
        staging,
        bucket,
        states,
        interval=config.checkpoint_interval,
        guard=lease.check,
        epoch=lease.epoch,
        chains=[ROOT_CHAIN] if ray else None,
    )
    shipper.start()
    gap = min(ACTOR_SHIP_GAP, config.checkpoint_interval)
    target = RemoteTarget(url, gap, {k: v + 1 for k, v in since.items()}, lease.epoch)
    try:
        result = run(local, only=only, redo=redo, remote=target)
    except ResumeRefused as exc:  # the bucket's run, not the staging directory, is refused
        _, _, rest = str(exc).partition(" holds ")
        shipper.stop()
        raise ResumeRefused(
            f"{url} holds {rest}".replace(
                "another --artifact-root, or remove the old run", "another prefix"
            )
        ) from None
    except BaseException:
        try:  # what was committed before the error or the stop is kept in the bucket
            shipper.stop()
        except BucketLockLost:  # another command holds the prefix: nothing more is shipped
            pass
        except Exception as exc:
            log.error("shipping the last segments to %s: %s", url, exc)
        raise
    shipper.stop()
    pushed = None
    if not (config.consolidate and result.complete):
        return result, pushed
    if ray:  # the actors' segments: the staging root becomes the bucket's committed prefix
        restore_staging(staging, bucket, reset=False)  # the session's manifest and checkpoint
        recover_worker_dirs(staging)
        _label_again(config, staging)
        shipper.ship()  # the labels given now
    done = finish(staging, expected_prompt_ids=plan_task(config).prompt_ids)
    result.consolidation, result.exports, result.validation = (
        done.consolidation,
        done.exports,
        done.validation,
    )
    if done.ok:
        pushed = ship_finished(staging, url, bucket=bucket)
        # the finished root holds every byte of the segments: they go (remote/compact.py)
        log.info("%s: %d segment object(s) removed", url, drop_segments(bucket))
    return result, pushed


def _label_again(config, staging: Path) -> None:
    """Judge-graded tasks: the driver labelled its staging root before the actors' last
    segments were restored; label what is still unlabelled."""
    from hallulog.contracts.run_manifest import RunManifest
    from hallulog.postrun.labels import label_with_judge, unlabeled_prompts
    from hallulog.tasks.grading import needs_judge_for

    manifest = RunManifest.require(staging)
    if needs_judge_for(manifest.get("answer_kind"), config.task) and unlabeled_prompts(staging):
        label_with_judge(
            staging,
            task=config.task,
            judge_url=config.judge_url,
            judge_model=config.judge_model or manifest.get("model"),
        )


def report_run(config, url: str, result, pushed) -> int:
    """Print what a run (or retry) on a bucket root did; its exit code."""
    from hallulog.cli import commands

    print(commands.format_result(result).replace(str(result.artifact_root), url))
    if pushed is not None:
        print(f"bucket: {url} ({pushed.files} files, {pushed.transferred} copied)")
    elif result.complete:
        why = "validation failed" if config.consolidate else "--consolidate false"
        print(
            f"bucket: {url} holds the run's segments; the finished root was not pushed "
            f"({why}; the staging root is {result.artifact_root})",
            file=sys.stderr,
        )
    else:
        print(
            f"bucket: {url} holds the committed work; rerun the same command to resume",
            file=sys.stderr,
        )
    if result.validation is not None and not result.validation["ok"]:
        commands.print_validation(result.validation)
    if result.failed:
        print(
            f"{len(result.failed)} prompt(s) failed: `hallulog retry --artifact-root {url}` "
            "reprocesses them",
            file=sys.stderr,
        )
        return 3
    if result.validation is not None and not result.validation["ok"]:
        return 1
    return 0

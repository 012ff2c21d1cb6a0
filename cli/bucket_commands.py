"""The commands on a root in a bucket: ``run`` (``cli/bucket_run.py``), and ``validate``,
``consolidate``, ``retry``, ``evaluate``, ``merge`` and ``estimate`` given ``s3://BUCKET/PREFIX``.

Each works on a local staging copy of the root (``hallulog.remote.root.stage_root``: the
finished root's files, else the worker directories rebuilt from the run's segments) and ships
what it writes back create-only. The rule for what a bucket already holds: **a finished root
(``.hallulog-tree.json``) is written once and never changed.**

- ``validate`` reads: it prints the report of the staged copy and writes nothing to the bucket.
- ``consolidate`` on a finished root does nothing (exit 0: it is consolidated and validated);
  on segments it consolidates, exports and validates the rebuilt root and, when validation
  passes, pushes it: the root is then finished. No disk needs to survive the run.
- ``retry`` on a finished root does nothing when there is nothing to redo, else it is refused
  (pull the root, retry there, push to another prefix); on segments it redoes the prompts to
  retry as a run into the bucket does, then finishes and pushes the root.
- ``evaluate`` reads a finished root (refused on segments: consolidate first) and writes its
  report to its own prefix, by default ``PREFIX/evaluation``, as a complete tree with its own
  file list, once: a prefix holding one is refused (give ``--out`` another). ``hallulog pull``
  of the root brings it along.
- ``merge`` stages every shard root given as a URL, merges them locally and, with ``--out
  s3://…``, pushes the merged root there; an ``--out`` prefix holding a finished root is refused.
- ``estimate`` checks free space on the staging directory, where the run writes.

An upload killed half-way is resumed by rerunning the command: objects it left that differ are
removed first (without the file list they were never part of a complete tree). Every command
that writes a prefix holds its lease (``remote/lease.py``) from before it stages
until it has pushed: a second writer, on any node, is refused up front naming the first.
docs/object-storage.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import shutil
import sys
from contextlib import ExitStack
from pathlib import Path

from hallulog.cli.bucket_staging import (
    drop_partial_upload,
    held_staging,
    remove_staging,
    ship_finished,
    stage_root,
    staging_dir_for,
)
from hallulog.config.plan import plan_task
from hallulog.contracts import layout
from hallulog.contracts.errors import HallulogError
from hallulog.remote.client import Bucket, object_url
from hallulog.remote.compact import drop_segments
from hallulog.remote.lease import bucket_lock
from hallulog.remote.restore import fence_session

__all__ = ["remote_command", "postrun_command", "evaluate_command", "merge_command"]


def _print_local(text: str, staging: Path, url: str) -> None:
    """``text`` with the staging root named as the bucket root it stands for."""
    print(text.replace(str(staging), url))


def remote_command(config, args: argparse.Namespace) -> int | None:
    """The CLI's handling of an ``s3://`` artifact root: None for a local root (the command
    runs as usual); else the command on the bucket root (its exit code)."""
    url = object_url(config.artifact_root)
    if url is None:
        return None
    if args.command != "run":
        return postrun_command(config, args, url)
    from hallulog.cli.bucket_run import report_run, run_remote

    result, pushed = run_remote(config)
    return report_run(config, url, result, pushed)


def postrun_command(config, args: argparse.Namespace, url: str) -> int:
    """``validate``, ``consolidate``, ``retry``, ``estimate`` on the bucket root ``url``."""
    staging = staging_dir_for(url, config.staging_dir, config.cache_dir)
    if args.command == "estimate":
        from hallulog.estimate.command import run_estimate

        return run_estimate(dataclasses.replace(config, artifact_root=staging), args)
    if args.command == "validate":
        return _validate(config, url, staging, deep=args.deep)
    if args.command == "consolidate":
        return _consolidate(config, url, staging, merge=args.merge)
    if args.command == "retry":
        return _retry(config, url, staging)
    raise HallulogError(f"hallulog {args.command} does not take an s3:// root")


def _validate(config, url: str, staging: Path, *, deep: bool) -> int:
    from hallulog.postrun.validate import format_report, validate

    explicit = config.staging_dir is not None
    with held_staging(url, staging, Bucket(url), "validate", explicit=explicit):
        staged = stage_root(url, staging)
        report = validate(staging, expected_prompt_ids=plan_task(config).prompt_ids)
        _print_local(format_report(report), staging, url)
        if not staged.finished:
            print(f"{url} holds the run's segments, no finished root", file=sys.stderr)
        rc = 0 if report["ok"] else 1
        if deep:
            from hallulog.evaluation import run_deep_audit

            rc = max(rc, 0 if run_deep_audit(staging)["ok"] else 1)
    return rc


def _consolidate(config, url: str, staging: Path, *, merge: bool) -> int:
    from hallulog.cli.commands import print_finished
    from hallulog.postrun.finish import finish
    from hallulog.remote.sync import read_tree_list

    bucket = Bucket(url)
    if read_tree_list(bucket) is not None:
        print(
            f"{url} holds a finished root (consolidated, validated, pushed): nothing to do; "
            "a finished root is written once (pull it to consolidate it otherwise)"
        )
        return 0
    explicit = config.staging_dir is not None
    with bucket_lock(bucket, "consolidate") as lease:
        if read_tree_list(bucket) is not None:  # pushed by the lease's previous holder
            print(f"{url} holds a finished root (consolidated, validated, pushed): nothing to do")
            return 0
        with held_staging(url, staging, bucket, "consolidate", explicit=explicit):
            # the segments are the truth from here: an earlier holder's later ones never count
            fence_session(bucket, lease.epoch, "consolidate", guard=lease.check)
            stage_root(url, staging, bucket=bucket)
            done = finish(staging, expected_prompt_ids=plan_task(config).prompt_ids, merge=merge)
            print_finished(done, local=(staging, url))
            if not done.ok:
                print(f"bucket: {url} keeps the segments; nothing pushed", file=sys.stderr)
                return 1
            pushed = ship_finished(staging, url, bucket=bucket)
            drop_segments(bucket)  # the finished root holds every byte of them
        remove_staging(staging, url)
    print(f"bucket: {url} ({pushed.files} files, {pushed.transferred} copied)")
    return 0


def _retry(config, url: str, staging: Path) -> int:
    from hallulog.cli.bucket_run import report_run, run_remote
    from hallulog.postrun.repair import prompts_to_retry
    from hallulog.remote.sync import read_tree_list

    if read_tree_list(Bucket(url)) is None:
        result, pushed = run_remote(config, retry=True)
        return report_run(config, url, result, pushed)
    with held_staging(url, staging, Bucket(url), "retry", explicit=config.staging_dir is not None):
        stage_root(url, staging)
        retry = prompts_to_retry(staging, plan_task(config).prompt_ids)
    if not retry:
        print(f"{url} holds a finished root with nothing to retry")
        return 0
    print(
        f"error: {url} holds a finished root, written once; to redo its {len(retry)} "
        f"incomplete prompt(s), `hallulog pull {url} DIR`, `hallulog retry --artifact-root "
        "DIR`, then push DIR to another prefix",
        file=sys.stderr,
    )
    return 1


# ---- evaluate -------------------------------------------------------------------------------


def _staged_finished(url: str, stack: ExitStack, command: str) -> Path:
    """The local copy of the finished root at ``url`` (its lock held by ``stack``)."""
    staging = staging_dir_for(url, None, None)
    stack.enter_context(held_staging(url, staging, Bucket(url), command, explicit=False))
    staged = stage_root(url, staging)
    if not staged.finished:
        raise HallulogError(
            f"{url} holds no finished root (only the run's segments): "
            f"`hallulog consolidate --artifact-root {url}` first"
        )
    return staging


def evaluate_command(args: argparse.Namespace) -> int:
    """``hallulog evaluate`` with a root, ``--train-root`` or ``--out`` in a bucket."""
    from hallulog.evaluation import run_evaluate
    from hallulog.remote.sync import read_tree_list, scan_tree, upload_tree

    root_url = object_url(args.artifact_root)
    out_url = object_url(args.out) if args.out is not None else None
    if out_url is None and args.out is None and root_url is not None:
        out_url = f"{root_url}/{layout.EVALUATION}"
    with ExitStack() as stack:
        local = argparse.Namespace(**vars(args))
        if root_url is not None:
            local.artifact_root = _staged_finished(root_url, stack, "evaluate")
        if getattr(args, "train_root", None) is not None and object_url(args.train_root):
            local.train_root = _staged_finished(object_url(args.train_root), stack, "evaluate")
        if out_url is not None:
            out_bucket = Bucket(out_url)
            if read_tree_list(out_bucket) is not None:
                raise HallulogError(
                    f"{out_url} already holds an evaluation (written once); give --out "
                    "another prefix"
                )
            # the roots read, nothing computed yet: a second writer of the report is refused
            lease = stack.enter_context(bucket_lock(out_bucket, "evaluate"))
            digest = hashlib.sha256(out_url.encode()).hexdigest()[:16]
            base = local.artifact_root if root_url is not None else Path(args.artifact_root)
            local.out = Path(base) / ".hallulog-out" / digest
            shutil.rmtree(local.out, ignore_errors=True)
        rc = run_evaluate(local)
        if rc != 0 or out_url is None:
            return rc
        drop_partial_upload(local.out, out_bucket)
        summary = upload_tree(
            local.out,
            out_bucket,
            scan_tree(local.out),
            extra={"kind": "hallulog evaluation", "root": root_url or str(args.artifact_root)},
            guard=lease.check,
        )
    print(f"bucket: {out_url} ({summary.files} files, {summary.transferred} copied)")
    return 0


# ---- merge ----------------------------------------------------------------------------------


def merge_command(args: argparse.Namespace) -> int:
    """``hallulog merge`` with shard roots or ``--out`` in a bucket."""
    from hallulog.cli.commands import print_merge
    from hallulog.postrun.merge import merge_shards
    from hallulog.remote.sync import read_tree_list

    out_url = object_url(args.out)
    with ExitStack() as stack:
        roots = []
        for root in args.shard_roots:
            url = object_url(root)
            if url is None:
                roots.append(Path(root))
                continue
            staging = staging_dir_for(url, None, None)
            stack.enter_context(held_staging(url, staging, Bucket(url), "merge", explicit=False))
            roots.append(stage_root(url, staging).root)
        out = Path(args.out)
        if out_url is not None:
            if read_tree_list(Bucket(out_url)) is not None:
                raise HallulogError(
                    f"--out {out_url} already holds a finished root (written once); choose "
                    "another prefix"
                )
            # the shards read, nothing merged yet: a second writer of --out is refused
            stack.enter_context(bucket_lock(out_url, "merge"))
            out = staging_dir_for(out_url, None, None)
            remove_staging(out, out_url)  # a merge starts from nothing: an earlier one's cache
        summary = merge_shards(out, roots, mode=args.mode)
        print_merge(summary, local=(out, out_url) if out_url else None)
        if not summary["validation"]["ok"]:
            return 1
        if out_url is not None:
            pushed = ship_finished(out, out_url)
            print(f"bucket: {out_url} ({pushed.files} files, {pushed.transferred} copied)")
    if out_url is not None:
        remove_staging(out, out_url)
    return 0

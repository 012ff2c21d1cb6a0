"""``hallulog run --artifact-root s3://BUCKET/PREFIX``: a run whose durable root is a bucket.

The worker's commit protocol needs append, fsync, truncate and rename, which an object store
does not have, so the run writes a local staging root exactly as a local run does (commit
markers, recovery, rollback unchanged) and ships what it has committed as immutable objects:

- **Segments.** Every ``--checkpoint-interval`` seconds (and once when the queue has drained, or
  the run stopped) each worker directory's newly committed bytes are shipped: per file, the
  byte range between the last shipped end and the committed end, as one create-only object
  ``.hallulog-run/segments/worker_{i}/{seq:08d}-{nonce}/{file}.{start}-{end}``, then the
  segment's manifest ``.hallulog-run/segments/worker_{i}/{seq:08d}.json`` (each file's committed
  end, the pieces with their CRC-32C, the prompt ids it commits), create-only, written last: the
  segment's commit point. Committed means covered by a ``prompt_index.jsonl`` line: the
  ``generations.jsonl`` / ``activation_index.jsonl`` lines up to the last one of a committed
  group, the packed store's ``commit.log`` up to the last committed record (its header first) and
  each shard up to the end of its last committed sample. These bytes are never rewritten (a
  rollback only cuts uncommitted tails), so shipped ranges stay valid.
- **Resume.** The bucket is the truth: the staging root's worker directories and checkpoint
  files are removed and rebuilt from the segments (each piece checked against its size and
  CRC-32C, the ranges contiguous), ``run_manifest.json`` from the copy shipped by the first
  session; the usual local resume (recovery, reconcile) then runs. A node that lost its disk
  starts from an empty staging directory; the prompts in no segment are redone.
- **Finish.** When the queue has drained, the usual post-run (consolidate, exports, validate)
  runs on the staging root and the finished root is pushed (``storage.object_sync``), so the
  prefix holds a complete root for ``hallulog pull`` and the bucket readers.

Exactly once: every object is create-only; a retried PUT that landed meets 412 and is compared
(same size and CRC-32C: kept; other bytes: the run stops, naming the key, as when another run
writes to the same prefix). docs/object-storage.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import logging
import sys
from pathlib import Path

from contracts.root_lock import root_lock
from orchestrator.errors import HallulogError
from orchestrator.remote_segments import RUN_PREFIX, SegmentShipper, restore_staging
from storage.object_store import CHECKSUM_ATTRIBUTE, Bucket, object_url

__all__ = ["staging_dir_for", "run_remote", "remote_command"]

log = logging.getLogger(__name__)


def staging_dir_for(url: str, configured: Path | None, cache_dir: Path | None) -> Path:
    """``--staging-dir``, else ``$HALLULOG_CACHE_DIR/staging/<bucket>-<hash of the URL>``."""
    if configured is not None:
        return Path(configured)
    from orchestrator.run.servers import hallulog_cache_dir

    bucket = url.partition("://")[2].split("/", 1)[0]
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return hallulog_cache_dir(cache_dir) / "staging" / f"{bucket}-{digest}"


def _drop_interrupted_push(staging: Path, bucket: Bucket) -> None:
    """Delete what an earlier, killed push of this run left that differs from the root now
    (post-run files carry their own timestamps, so a rerun's consolidation differs): without
    ``.hallulog-tree.json`` those objects were never part of a complete root."""
    present = {k: v for k, v in bucket.list().items() if not k.startswith(f"{RUN_PREFIX}/")}
    if not present:
        return
    from orchestrator.push_pull import excluded
    from storage.object_sync import scan_tree

    entries = {e.path: e for e in scan_tree(staging, excluded)}
    for key, size in sorted(present.items()):
        entry = entries.get(key)
        if (
            entry is not None
            and entry.size == size
            and bucket.attributes(key, size).get(CHECKSUM_ATTRIBUTE) == entry.crc32c
        ):
            continue
        log.warning(
            "%s: removing it (left by an interrupted push, other bytes than the root's)",
            bucket.display(key),
        )
        bucket.delete(key)


def _expected_ids(config) -> set[str]:
    from orchestrator.tasks import open_config_task

    return {g.prompt_id for g in open_config_task(config.to_dict()).groups()}


def run_remote(config):
    """``run(config)`` for an ``s3://`` artifact root: staging, segments, post-run, push.
    Returns the run's ``RunResult`` (its ``artifact_root`` the staging root) and the summary of
    the push (None when the run did not finish)."""
    from storage.object_sync import read_tree_list

    url = object_url(config.artifact_root)
    if config.storage_format != "packed":
        raise HallulogError(
            f"--artifact-root {url}: a run into a bucket stores activations as "
            f"packed (got --storage-format {config.storage_format})"
        )
    if config.executor != "local":
        raise HallulogError(f"--artifact-root {url}: a run into a bucket needs --executor local")
    bucket = Bucket(url)
    if read_tree_list(bucket) is not None:
        raise HallulogError(
            f"{url} already holds a finished root; read it with `hallulog pull "
            f"{url} DIR` or the bucket readers, or choose another prefix"
        )
    staging = staging_dir_for(url, config.staging_dir, config.cache_dir)
    staging.mkdir(parents=True, exist_ok=True)
    with root_lock(staging, "run"):  # restoring rewrites the staging root: one writer
        return _run_staged(config, url, bucket, staging)


def _run_staged(config, url: str, bucket: Bucket, staging: Path):
    from orchestrator.postrun.finish import finish
    from orchestrator.push_pull import push_root
    from orchestrator.run import run

    states = restore_staging(staging, bucket)
    shipper = SegmentShipper(staging, bucket, states, interval=config.checkpoint_interval)
    shipper.start()
    local = dataclasses.replace(config, artifact_root=staging, consolidate=False, staging_dir=None)
    try:
        result = run(local)
    except BaseException:
        try:  # what was committed before the error or the stop is kept in the bucket
            shipper.stop()
        except Exception as exc:
            log.error("shipping the last segments to %s: %s", url, exc)
        raise
    shipper.stop()
    pushed = None
    if config.consolidate and result.complete:
        done = finish(staging, expected_prompt_ids=_expected_ids(config))
        result.consolidation, result.exports, result.validation = (
            done.consolidation,
            done.exports,
            done.validation,
        )
        if done.ok:
            _drop_interrupted_push(staging, bucket)
            pushed = push_root(staging, url, bucket=bucket)
    return result, pushed


def remote_command(config, args: argparse.Namespace) -> int | None:
    """The CLI's handling of an ``s3://`` artifact root: None for a local root (the command
    runs as usual); else ``run`` into the bucket (its exit code), any other command refused
    with one line (2)."""
    url = object_url(config.artifact_root)
    if url is None:
        return None
    if args.command != "run":
        print(
            f"hallulog {args.command}: error: --artifact-root {url}: {args.command} works "
            f"on a local root; copy it with `hallulog pull {url} DIR` and give "
            "--artifact-root DIR (docs/object-storage.md)",
            file=sys.stderr,
        )
        return 2
    from orchestrator import commands

    result, pushed = run_remote(config)
    print(commands.format_result(result))
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
    if result.failed:
        print(
            f"{len(result.failed)} prompt(s) failed: see worker_*/errors.jsonl in "
            f"{result.artifact_root}",
            file=sys.stderr,
        )
        return 3
    if result.validation is not None and not result.validation["ok"]:
        return 1
    return 0

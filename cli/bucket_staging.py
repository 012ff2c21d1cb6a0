"""A root in a bucket (``s3://bucket/prefix``), made local for a command, and shipped back.

Every command that takes an ``s3://`` root works on a local *staging* copy (``--staging-dir``,
default one directory per URL under ``$HALLULOG_CACHE_DIR/staging``), made by
:func:`stage_root` from what the bucket holds:

- a **finished root** (``.hallulog-tree.json`` present: the run, ``consolidate`` or ``merge``
  pushed it): its files, as ``hallulog pull`` copies them (files already there with the same
  bytes are kept, others replaced: the bucket is the truth);
- else the run's **segments** (``.hallulog-run/``): the worker directories rebuilt from them
  (``remote/restore.py``), rolled back to their last commit as a resume does, and no
  ``consolidated/`` (it is never shipped before the root is finished).

What a command writes goes back with :func:`ship_finished` (the root, create-only, once), under
the prefix's lease (``remote/lease.py``).
docs/object-storage.md.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from hallulog.contracts import layout
from hallulog.remote.client import object_url

__all__ = [
    "staging_dir_for",
    "root_manifest",
    "Staged",
    "stage_root",
    "recover_worker_dirs",
    "ship_finished",
    "drop_partial_upload",
]

log = logging.getLogger(__name__)


def staging_dir_for(url: str, configured: Path | None, cache_dir: Path | None) -> Path:
    """``--staging-dir``, else ``$HALLULOG_CACHE_DIR/staging/<bucket>-<hash of the URL>``."""
    if configured is not None:
        return Path(configured)
    from hallulog.backends.models import hallulog_cache_dir

    bucket = url.partition("://")[2].split("/", 1)[0]
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return hallulog_cache_dir(cache_dir) / "staging" / f"{bucket}-{digest}"


def root_manifest(root: str | os.PathLike) -> dict | None:
    """The run manifest of a local root, or of a root in a bucket (the finished root's, else
    the one the run shipped first); None when there is none."""
    url = object_url(root)
    if url is None:
        from hallulog.config.manifest import load_manifest

        return load_manifest(Path(root))
    from hallulog.remote.client import Bucket
    from hallulog.remote.segments import RUN_PREFIX

    bucket = Bucket(url)
    for key in (layout.MANIFEST, f"{RUN_PREFIX}/{layout.MANIFEST}"):
        if bucket.head(key) is not None:
            return _manifest_object(bucket, key)
    return None


def _manifest_object(bucket, key: str) -> dict:
    """A manifest document in the bucket (one JSON object, not lines)."""
    import json

    from hallulog.contracts.errors import ArtifactError

    try:
        doc = json.loads(bucket.get_bytes(key))
    except ValueError as exc:
        raise ArtifactError(f"{bucket.display(key)}: malformed manifest ({exc})") from None
    if not isinstance(doc, dict):
        raise ArtifactError(f"{bucket.display(key)}: malformed manifest (not an object)")
    return doc


@dataclass
class Staged:
    """A root in a bucket, made local by :func:`stage_root`."""

    url: str
    root: Path
    """The local staging copy."""
    finished: bool
    """The bucket holds a finished root (pushed, ``.hallulog-tree.json``); else its segments."""
    tree: dict | None = None
    """The finished root's file list."""


def recover_worker_dirs(root: Path) -> set[str]:
    """Roll every worker directory of ``root`` back to its last commit (as a resume does; it
    also rebuilds the stores' own manifests); the committed prompt ids."""
    from hallulog.contracts.run_manifest import RunManifest
    from hallulog.workers.persist import recover_worker_dir

    manifest = RunManifest.require(root)
    done: set[str] = set()
    for wdir in layout.worker_dirs(root):
        done |= recover_worker_dir(
            wdir,
            storage_format=manifest.storage_format,
            layer_ids=manifest.layer_ids,
            hidden_size=int(manifest.get("hidden_size")),
            dtype=str(manifest.get("dtype")),
        )
    return done


def stage_root(url: str, staging: Path, *, bucket=None) -> Staged:
    """Make ``staging`` the local copy of the root at ``url`` (module docstring). The caller
    holds ``staging``'s root lock."""
    from hallulog.remote.client import Bucket
    from hallulog.remote.restore import restore_staging
    from hallulog.remote.sync import download_tree, read_tree_list

    bucket = bucket or Bucket(url)
    staging.mkdir(parents=True, exist_ok=True)
    tree = read_tree_list(bucket)
    if tree is not None:
        download_tree(bucket, staging, replace=True)
        return Staged(url, staging, True, tree)
    states = restore_staging(staging, bucket)
    if not states and not (staging / layout.MANIFEST).is_file():
        from hallulog.contracts.errors import HallulogError

        raise HallulogError(f"{url} holds no hallulog run (neither a finished root nor segments)")
    shutil.rmtree(layout.consolidated_dir(staging), ignore_errors=True)
    if (staging / layout.MANIFEST).is_file():
        recover_worker_dirs(staging)
    return Staged(url, staging, False)


def drop_partial_upload(staging: Path, bucket) -> None:
    """Delete what an earlier, killed push to this prefix left that differs from the root now
    (post-run files carry their own timestamps, so a rerun's consolidation differs): without
    ``.hallulog-tree.json`` those objects were never part of a complete root."""
    from hallulog.cli.push_pull import excluded
    from hallulog.remote.client import CHECKSUM_ATTRIBUTE
    from hallulog.remote.segments import RUN_PREFIX
    from hallulog.remote.sync import scan_tree

    present = {k: v for k, v in bucket.list().items() if not k.startswith(f"{RUN_PREFIX}/")}
    if not present:
        return
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


def ship_finished(staging: Path, url: str, *, bucket=None, drop_partial: bool = True):
    """Push the finished local root ``staging`` to ``url`` (create-only, the file list last):
    the summary of ``push_root``. Objects of an interrupted earlier push that differ are
    deleted first (``drop_partial``; the prefix holds no file list, so they were never part of
    a complete root)."""
    from hallulog.cli.push_pull import push_root
    from hallulog.remote.client import Bucket
    from hallulog.remote.lease import bucket_lock
    from hallulog.remote.sync import read_tree_list

    bucket = bucket or Bucket(url)
    with bucket_lock(bucket, "push") as lease:  # the caller's, when it holds it
        lease.check()
        if drop_partial and read_tree_list(bucket) is None:
            drop_partial_upload(staging, bucket)
        return push_root(staging, url, bucket=bucket)

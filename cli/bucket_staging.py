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

The staging directory is a **cache of one run id**, never a truth of its own
(:func:`held_staging`): when the bucket holds no run, or another run id, a staging directory
holding a run is set aside (the default one, under the cache, removed; a ``--staging-dir``
moved aside to ``DIR.set-aside-<run id>``), in one line, and the command starts from what the
bucket holds. Once a command has pushed the finished root, its staging directory is removed
(:func:`remove_staging`): every byte of it is in the bucket.

What a command writes goes back with :func:`ship_finished` (the root, create-only, once), under
the prefix's lease (``remote/lease.py``).
docs/object-storage.md.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from hallulog.contracts import layout
from hallulog.contracts.root_lock import LOCK_FILE, root_lock
from hallulog.remote.client import object_url

__all__ = [
    "staging_dir_for",
    "held_staging",
    "remove_staging",
    "bucket_run_id",
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


def bucket_run_id(bucket) -> str | None:
    """The run id the bucket prefix holds (its finished root's, else the run's first
    manifest's), None when it holds no run."""
    from hallulog.remote.segments import RUN_PREFIX

    for key in (layout.MANIFEST, f"{RUN_PREFIX}/{layout.MANIFEST}"):
        if bucket.head(key) is not None:
            run_id = _manifest_object(bucket, key).get("run_id")
            return str(run_id) if run_id is not None else None
    return None


def _staged_run_id(staging: Path) -> str | None:
    """The run id of the run a staging directory caches (None: it holds no run)."""
    import json

    try:
        doc = json.loads((staging / layout.MANIFEST).read_text())
    except FileNotFoundError:
        return None
    except ValueError:  # a torn manifest: no run to keep
        return "(unreadable manifest)"
    return str(doc.get("run_id")) if isinstance(doc, dict) else "(unreadable manifest)"


def _set_aside(staging: Path, run_id: str, explicit: bool) -> str:
    """Move ``staging`` out of the way; what was done, in words. A ``--staging-dir`` is moved
    aside (nothing of a directory the user named is deleted); the default one, under the
    cache, is removed."""
    if explicit:
        tag = "".join(c for c in run_id if c.isalnum() or c in "-_")[:16] or "run"
        dest = staging.with_name(f"{staging.name}.set-aside-{tag}")
        n = 1
        while dest.exists():
            n += 1
            dest = staging.with_name(f"{staging.name}.set-aside-{tag}-{n}")
        staging.rename(dest)
        return f"moved aside to {dest}"
    _discard(staging)
    return "removed"


def _discard(path: Path) -> None:
    """Remove a directory of ours: renamed first (one atomic step: no command finds it half
    removed), then deleted."""
    gone = path.with_name(f".{path.name}.removing-{os.getpid()}-{time.monotonic_ns()}")
    path.rename(gone)
    shutil.rmtree(gone, ignore_errors=True)


@contextmanager
def held_staging(
    url: str, staging: Path, bucket, command: str, *, explicit: bool
) -> Iterator[Path]:
    """Hold the staging root ``staging`` of ``url`` for ``command`` (its root lock), as a cache
    of the run the bucket holds: a staging directory that holds another run, or a run while
    the bucket holds none, is set aside first, in one line (module docstring). The caller holds
    the prefix's lease, so the bucket's run does not change meanwhile."""
    staging.mkdir(parents=True, exist_ok=True)
    with root_lock(staging, command):
        cached = _staged_run_id(staging)
        truth = bucket_run_id(bucket) if cached is not None else None
        done = None
        if cached is not None and cached != truth:
            done = _set_aside(staging, cached, explicit)
    if done is not None:  # the lock moved with the directory: take the new one's
        held = f"holds run {truth}" if truth else "holds no run"
        log.warning(
            "%s %s: the staging directory %s held run %s, %s (the bucket is the truth; the "
            "staging directory only caches it)",
            url,
            held,
            staging,
            cached,
            done,
        )
        staging.mkdir(parents=True, exist_ok=True)
    with root_lock(staging, command):
        yield staging


_RUN_ENTRIES = (
    layout.MANIFEST,
    layout.CHECKPOINT,
    layout.COMPLETION_LOG,
    layout.LABELS,
    layout.CONSOLIDATED,
    layout.EVALUATION,
    LOCK_FILE,
    ".hallulog-out",
)


def remove_staging(staging: Path, url: str) -> None:
    """A staging root whose finished root is in the bucket at ``url``: nobody uses it any more;
    remove what a run writes there (and the directory, when that was all it held)."""
    if not staging.is_dir():
        return
    names = {
        *_RUN_ENTRIES,
        layout.servers_dir(staging).name,
        layout.run_spool_dir(staging).name,
    }
    for entry in list(staging.iterdir()):
        ours = entry.name.endswith((".lock", ".tmp", ".partial")) or entry.name in names
        if ours or layout.worker_id_of(entry.name) is not None:
            if entry.is_dir() and not entry.is_symlink():
                _discard(entry)
            else:
                entry.unlink(missing_ok=True)
    try:
        staging.rmdir()
    except OSError:  # files of the user's own in a --staging-dir: kept
        log.warning("%s: left in place (it holds files no run wrote)", staging)
        return
    log.info("%s: removed (the finished root is in %s)", staging, url)


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

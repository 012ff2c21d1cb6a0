"""``hallulog push ROOT s3://BUCKET/PREFIX`` and ``hallulog pull s3://BUCKET/PREFIX ROOT``.

Push copies a finished artifact root to a bucket, pull copies it back (remote/sync.py:
create-only writes, exactly once, resumable after a kill). What travels: every file of the root
except what only the live run uses (``spool/``, server pid files, ``*.tmp``, ``*.partial``,
lock files, the shared-filesystem probe). A push holds the prefix's lease
(``remote/lease.py``): a second writer on the prefix is refused up front.
docs/object-storage.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from hallulog.contracts import layout
from hallulog.contracts.errors import HallulogError
from hallulog.remote.client import Bucket, ObjectStoreError, object_url, split_url
from hallulog.remote.sync import SyncSummary, download_tree, scan_tree, upload_tree

__all__ = [
    "add_push_parser",
    "add_pull_parser",
    "run_push",
    "run_pull",
    "push_root",
    "pull_root",
    "PushRefused",
    "excluded",
]

log = logging.getLogger(__name__)

_SKIP_SUFFIXES = (".tmp", ".partial", ".lock", ".pid")
_SKIP_NAMES = (".hallulog-shared-fs-probe",)
_SKIP_DIRS = ("spool/",)


class PushRefused(HallulogError, ValueError):
    """The root is not a finished artifact root (the message says what to run first)."""


def excluded(rel: str) -> bool:
    """Whether a root-relative path (``/``-separated; directories end in ``/``) stays local."""
    name = rel.rstrip("/").rsplit("/", 1)[-1]
    return rel in _SKIP_DIRS or name in _SKIP_NAMES or name.endswith(_SKIP_SUFFIXES)


def _check_finished(root: Path) -> dict:
    from hallulog.config.manifest import load_manifest

    if not root.is_dir():
        raise PushRefused(f"{root}: no such directory")
    manifest = load_manifest(root)
    if manifest is None:
        raise PushRefused(f"{root}: no {layout.MANIFEST} (not a hallulog artifact root)")
    report = layout.consolidated_dir(root) / layout.VALIDATION_REPORT
    if not report.is_file():
        raise PushRefused(
            f"{root}: not finished ({report} is missing); let the run finish, or "
            f"run `hallulog run --consolidate-only --artifact-root {root}` first"
        )
    return manifest


def push_root(
    root: str | os.PathLike, url: str, concurrency: int = 8, bucket: Bucket | None = None
) -> SyncSummary:
    """Copy the finished artifact root ``root`` to ``url`` (exactly once, resumable), holding
    the prefix's lease while it writes."""
    from hallulog.remote.lease import bucket_lock
    from hallulog.remote.sync import read_tree_list

    root = Path(root)
    manifest = _check_finished(root)
    bucket = bucket or Bucket(url)
    entries = scan_tree(root, excluded)
    extra = {"kind": "hallulog artifact root", "run_id": manifest.get("run_id")}
    if read_tree_list(bucket) is not None:  # complete already (a no-op) or refused: no write
        return upload_tree(root, bucket, entries, extra=extra, concurrency=concurrency)
    with bucket_lock(bucket, "push") as lease:
        return upload_tree(
            root, bucket, entries, extra=extra, concurrency=concurrency, guard=lease.check
        )


def pull_root(
    url: str, root: str | os.PathLike, concurrency: int = 8, bucket: Bucket | None = None
) -> SyncSummary:
    """Copy the root pushed to ``url`` into the local directory ``root`` (resumable), and the
    trees written under it since (``evaluate``'s report, each with its own file list)."""
    from hallulog.remote.segments import RUN_PREFIX
    from hallulog.remote.sync import TREE_LIST

    bucket = bucket or Bucket(url)
    summary = download_tree(bucket, Path(root), concurrency=concurrency)
    nested = sorted(
        key[: -len(TREE_LIST) - 1]
        for key in bucket.list()
        if key.endswith(f"/{TREE_LIST}") and not key.startswith(f"{RUN_PREFIX}/")
    )
    for sub in nested:
        part = download_tree(Bucket(bucket.display(sub)), Path(root) / sub, concurrency=concurrency)
        summary.files += part.files
        summary.transferred += part.transferred
        summary.skipped += part.skipped
        summary.bytes_transferred += part.bytes_transferred
    return summary


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--concurrency", type=int, default=8, help="Objects transferred at once (default 8)."
    )
    p.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="Logging level.",
    )
    p.add_argument("--debug", action="store_true", help="Show the traceback of an error.")


def add_push_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "push",
        help="Copy a finished artifact root to a bucket (s3://BUCKET/PREFIX).",
        description="Upload every file of a finished artifact root with create-only writes: "
        "a rerun after an interruption uploads only what is missing and never "
        "overwrites an object. Credentials: the AWS environment/config chain; "
        "endpoint: AWS_ENDPOINT_URL (docs/object-storage.md).",
    )
    p.add_argument("root", type=Path, metavar="ROOT", help="The finished artifact root.")
    p.add_argument("url", metavar="URL", help="s3://BUCKET/PREFIX")
    _common(p)
    return p


def add_pull_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "pull",
        help="Copy an artifact root pushed to a bucket into a local directory.",
        description="Download a root written by `push` (refused while its push is unfinished); "
        "a rerun after an interruption downloads only what is missing.",
    )
    p.add_argument("url", metavar="URL", help="s3://BUCKET/PREFIX")
    p.add_argument("root", type=Path, metavar="ROOT", help="Local directory to fill.")
    _common(p)
    return p


def _url_or_exit(prog: str, value: str) -> str | None:
    try:
        split_url(value)
    except ObjectStoreError as exc:
        print(f"hallulog {prog}: error: {exc}", file=sys.stderr)
        return None
    return object_url(value)


def _run(prog: str, args: argparse.Namespace, fn, *fn_args) -> int:
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    if args.concurrency < 1:
        print(f"hallulog {prog}: error: --concurrency must be >= 1", file=sys.stderr)
        return 2
    try:
        summary = fn(*fn_args, concurrency=args.concurrency)
    except (PushRefused, ObjectStoreError, OSError, HallulogError) as exc:
        if args.debug:
            raise
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, OSError) and not isinstance(exc, ObjectStoreError) and exc.filename:
            text = f"{exc.filename}: {exc.strerror}"
        print(f"error: {text}", file=sys.stderr)
        return 1
    state = (
        "already complete"
        if summary.already_complete
        else f"{summary.transferred} copied ({summary.bytes_transferred / 1e6:.1f} MB), "
        f"{summary.skipped} already there"
    )
    print(f"{prog}: {summary.files} files, {state}, {summary.seconds:.1f} s")
    return 0


def run_push(args: argparse.Namespace) -> int:
    """Exit 0 pushed (or already), 1 refused or failed (one line), 2 a bad argument."""
    url = _url_or_exit("push", args.url)
    if url is None:
        return 2
    return _run("push", args, push_root, args.root, url)


def run_pull(args: argparse.Namespace) -> int:
    """Exit 0 pulled (or already), 1 refused or failed (one line), 2 a bad argument."""
    url = _url_or_exit("pull", args.url)
    if url is None:
        return 2
    if object_url(args.root) is not None:
        print(
            f"hallulog pull: error: {args.root} is a URL; pull writes to a local directory",
            file=sys.stderr,
        )
        return 2
    return _run("pull", args, pull_root, url, args.root)

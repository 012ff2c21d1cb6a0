"""Shared-memory files the servers' children leave in ``/dev/shm`` when they are killed.

vLLM's engine processes create POSIX shared memory and semaphores: ``psm_*`` (Python's
``multiprocessing.shared_memory``, vLLM's message queues), ``sem.loky-*`` (loky's semaphores)
and ``vllm_dist_*`` (its CPU tensor-parallel buffers). They unlink them when they exit cleanly;
a SIGKILLed group (a hung server, a crashed run) leaves them behind, each up to hundreds of MB
of RAM. The run removes them:

* a server records the names present when it starts; when its group is stopped, the new ones
  that no live process maps or holds open are removed (:func:`sweep` with ``candidates``);
* a run's start removes such files of this user that no live process uses and that are older
  than :data:`ORPHAN_AGE_SECONDS` (left by a run that was itself SIGKILLed).

A file is only ever removed when no process on the machine maps it (``/proc/*/maps``) or has
it open (``/proc/*/fd``), so another run's live files are never touched.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

__all__ = ["SHM_DIR", "PATTERNS", "ORPHAN_AGE_SECONDS", "shm_names", "in_use", "orphaned", "sweep"]

log = logging.getLogger(__name__)

SHM_DIR = Path(os.environ.get("HALLULOG_SHM_DIR", "/dev/shm"))
PATTERNS = ("psm_*", "sem.loky-*", "vllm_dist_*")
ORPHAN_AGE_SECONDS = 300.0


def shm_names(directory: Path | None = None) -> set[str]:
    """The names in ``/dev/shm`` matching :data:`PATTERNS`."""
    directory = directory or SHM_DIR
    names: set[str] = set()
    for pattern in PATTERNS:
        try:
            names.update(p.name for p in directory.glob(pattern))
        except OSError:
            pass
    return names


def in_use(directory: Path | None = None) -> set[int]:
    """Inodes of files under ``directory`` some live process maps or holds open (by inode:
    glibc maps a named semaphore under a temporary name it then links to the real one)."""
    prefix = str(directory or SHM_DIR) + "/"
    used: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/maps", "rb") as f:
                for line in f:
                    if prefix.encode() in line:
                        fields = line.split()
                        if len(fields) >= 6 and fields[4].isdigit():
                            used.add(int(fields[4]))
        except OSError:
            pass
        try:
            for fd in os.scandir(f"/proc/{entry.name}/fd"):
                try:
                    if os.readlink(fd.path).startswith(prefix):
                        used.add(os.stat(fd.path).st_ino)
                except OSError:
                    continue
        except OSError:
            pass
    return used


def _creator_alive(name: str) -> bool:
    """``sem.loky-<pid>-…`` names their creator: kept while it lives."""
    if not name.startswith("sem.loky-"):
        return False
    pid = name.split("-")[1]
    return pid.isdigit() and Path(f"/proc/{pid}").exists()


def orphaned(names: set[str], directory: Path | None = None) -> set[str]:
    """Those of ``names`` still present that no live process uses (what :func:`sweep` would
    remove, whatever their age or owner)."""
    directory = directory or SHM_DIR
    used, found = in_use(directory), set()
    for name in names:
        try:
            ino = (directory / name).stat().st_ino
        except OSError:
            continue
        if ino not in used and not _creator_alive(name):
            found.add(name)
    return found


def sweep(
    candidates: set[str] | None = None,
    *,
    min_age: float = ORPHAN_AGE_SECONDS,
    directory: Path | None = None,
) -> list[str]:
    """Remove unused shared-memory files; returns their names.

    ``candidates`` given: only those names (files a stopped server created). None: every
    matching file of this user. Either way only files older than ``min_age`` seconds (a file
    just created may not be mapped yet)."""
    directory = directory or SHM_DIR
    names = shm_names(directory) if candidates is None else candidates & shm_names(directory)
    if not names:
        return []
    used = in_use(directory)
    uid, now, removed = os.getuid(), time.time(), []
    for name in sorted(names):
        path = directory / name
        try:
            st = path.stat()
            if (
                st.st_ino in used
                or st.st_uid != uid
                or now - st.st_mtime < min_age
                or _creator_alive(name)
            ):
                continue
            path.unlink()
            removed.append(name)
        except OSError:
            continue
    if removed:
        log.info(
            "removed %d shared-memory file(s) left by killed processes in %s: %s",
            len(removed),
            directory,
            ", ".join(removed[:5]) + (" ..." if len(removed) > 5 else ""),
        )
    return removed

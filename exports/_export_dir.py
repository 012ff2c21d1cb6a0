"""Where an export is written: a new (or empty) directory that appears complete or not at all.

Every export (saev, saelens) builds its files in a hidden sibling ``.<name>.partial-<pid>`` and
renames it onto the destination as its last step, so a crash never leaves a directory at the
destination that looks like a finished export.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator

from hallulog.storage._io import fsync_dir
from hallulog.storage.errors import StorageError

log = logging.getLogger(__name__)

__all__ = ["check_new_dir", "staged_dir"]


def check_new_dir(dst, arg: str = "dst") -> str:
    """Absolute ``dst``; a ``StorageError`` naming ``arg`` when it exists and is not an empty directory."""
    dst = os.path.abspath(os.fspath(dst))
    if os.path.exists(dst) and (not os.path.isdir(dst) or os.listdir(dst)):
        raise StorageError(f"{arg}: export target exists and is not an empty directory", dst)
    return dst


@contextlib.contextmanager
def staged_dir(dst, arg: str = "dst") -> Iterator[str]:
    """Yield a fresh temporary directory; on success it is fsynced and renamed to ``dst``.

    On an exception the temporary directory is removed and ``dst`` is left as it was.
    """
    dst = check_new_dir(dst, arg)
    parent, name = os.path.split(dst)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{name}.partial-{os.getpid()}")
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    try:
        yield tmp
        for root, _dirs, _files in os.walk(tmp, topdown=False):
            fsync_dir(root)
        check_new_dir(dst, arg)  # nobody wrote there meanwhile
        os.replace(tmp, dst)  # an empty dst directory is replaced atomically
        fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("export complete at %s", dst)

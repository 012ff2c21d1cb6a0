"""``completed_prompts.json``: the set of completed prompt ids, rewritten atomically.

Writes go to ``completed_prompts.json.partial`` then ``os.replace`` under a ``filelock`` lock,
on a background thread so that a slow disk never stalls the run loop or the status API.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock

from contracts import layout
from orchestrator.errors import ArtifactError

__all__ = ["CHECKPOINT_NAME", "load_completed", "write_completed", "CheckpointWriter"]

log = logging.getLogger(__name__)

CHECKPOINT_NAME = layout.CHECKPOINT


def load_completed(artifact_root: Path) -> set[str]:
    """Prompt ids recorded in ``completed_prompts.json`` (empty when there is none)."""
    path = Path(artifact_root) / CHECKPOINT_NAME
    if not path.exists():
        return set()
    with FileLock(str(path) + ".lock"):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ArtifactError(f"{path}:{exc.lineno}: malformed checkpoint ({exc.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("completed"), list):
        raise ArtifactError(f"{path}: expected an object with a 'completed' list")
    return set(data["completed"])


def write_completed(artifact_root: Path, completed: set[str], run_id: str) -> None:
    """Atomically rewrite ``completed_prompts.json`` under its file lock."""
    path = Path(artifact_root) / CHECKPOINT_NAME
    body = {"run_id": run_id, "updated_at": datetime.now(timezone.utc).isoformat(),
            "count": len(completed), "completed": sorted(completed)}
    tmp = path.with_name(path.name + ".partial")
    with FileLock(str(path) + ".lock"):
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(body, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


class CheckpointWriter:
    """Coalescing background writer: ``request`` never blocks on the disk."""

    def __init__(self, artifact_root: Path, run_id: str) -> None:
        self.artifact_root = Path(artifact_root)
        self.run_id = run_id
        self._pending: set[str] | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="checkpoint", daemon=True)
        self._thread.start()

    def request(self, completed: set[str]) -> None:
        """Schedule a rewrite with this snapshot of the completed set (latest wins)."""
        with self._cond:
            self._pending = set(completed)
            self._cond.notify()

    def close(self, final: set[str] | None = None) -> None:
        """Write ``final`` (or the last request) and stop; raises a write error, if any."""
        with self._cond:
            if final is not None:
                self._pending = set(final)
            self._closed = True
            self._cond.notify()
        self._thread.join()
        if self._error is not None:
            raise self._error

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                snapshot, self._pending = self._pending, None
                closed = self._closed
            if snapshot is not None:
                try:
                    write_completed(self.artifact_root, snapshot, self.run_id)
                except OSError as exc:
                    log.error("could not write %s: %s", CHECKPOINT_NAME, exc)
                    self._error = exc
            if closed:
                with self._cond:
                    if self._pending is None:
                        return

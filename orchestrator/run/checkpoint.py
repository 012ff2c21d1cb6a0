"""The checkpoint: an append-only completion log plus a periodic snapshot.

- ``completions.log`` (``hallulog.contracts.layout.COMPLETION_LOG``): one line per completed prompt id,
  appended and fsynced by the driver as groups complete (ids that arrive together share one
  fsync). Cost per group: O(1). During a run it is the truth; a torn last line (crash
  mid-append) is ignored and cut before the next append.
- ``completed_prompts.json``: the whole set, rewritten atomically
  (``completed_prompts.json.partial`` then ``os.replace`` under a ``filelock`` lock) on a
  background thread every ``--checkpoint-interval`` seconds and at every clean stop, where it is
  exact. Once a snapshot covering the whole log is durable (at a clean stop, and on resume
  after reconciling with the data), the log is emptied.

On resume the orchestrator reads both, and the worker data wins (``loop._reconcile``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock
from hallulog.contracts import layout
from hallulog.contracts.errors import ArtifactError
from hallulog.contracts.jsonl import committed_size, cut_torn_tail, truncate_to

__all__ = [
    "CHECKPOINT_NAME",
    "load_completed",
    "write_completed",
    "CheckpointWriter",
    "CompletionLog",
    "read_completion_log",
]

log = logging.getLogger(__name__)

CHECKPOINT_NAME = layout.CHECKPOINT


def read_completion_log(artifact_root: Path) -> set[str]:
    """Prompt ids in ``completions.log`` (committed lines only; empty when there is none)."""
    path = Path(artifact_root) / layout.COMPLETION_LOG
    if not path.exists():
        return set()
    end = committed_size(path)
    with open(path, "rb") as f:
        data = f.read(end)
    return {line.strip().decode("ascii", "replace") for line in data.splitlines() if line.strip()}


class CompletionLog:
    """The driver's append-only ``completions.log``."""

    def __init__(self, artifact_root: Path) -> None:
        self.path = Path(artifact_root) / layout.COMPLETION_LOG
        cut_torn_tail(self.path)
        self._f = open(self.path, "ab")

    def append(self, prompt_ids: list[str]) -> None:
        """Append these ids durably: one write, one fsync."""
        if prompt_ids:
            self._f.write("".join(pid + "\n" for pid in prompt_ids).encode("ascii"))
            self._f.flush()
            os.fsync(self._f.fileno())

    def reset(self) -> None:
        """Empty the log (a durable snapshot now covers everything in it)."""
        self._f.flush()
        truncate_to(self.path, 0)
        self._f.seek(0, os.SEEK_END)

    def close(self) -> None:
        self._f.close()


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
        except UnicodeDecodeError as exc:
            raise ArtifactError(f"{path}: not UTF-8 (byte offset {exc.start})") from None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("completed"), list)
        or not all(isinstance(x, str) for x in data["completed"])
    ):
        raise ArtifactError(f"{path}: expected an object with a 'completed' list of prompt ids")
    return set(data["completed"])


def write_completed(artifact_root: Path, completed: set[str], run_id: str) -> None:
    """Atomically rewrite ``completed_prompts.json`` under its file lock."""
    path = Path(artifact_root) / CHECKPOINT_NAME
    body = {
        "run_id": run_id,
        "updated_at": datetime.now(timezone.utc).isoformat(),
        "count": len(completed),
        "completed": sorted(completed),
    }
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

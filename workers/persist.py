"""Persisting prompt groups into a worker directory, and rolling back after a crash.

Commit order (DESIGN.md): activations written and fsynced → ``generations.jsonl`` and
``activation_index.jsonl`` lines appended and fsynced → the group's ``prompt_index.jsonl`` line
appended and fsynced (the commit marker) → done reported. A worker persists one group at a time,
so after a crash everything not covered by a ``prompt_index.jsonl`` line is a tail that
``recover_worker_dir`` removes.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import storage

__all__ = ["WorkerDir", "GenerationRecord", "recover_worker_dir", "read_jsonl_committed",
           "JSONL_FILES"]

log = logging.getLogger(__name__)

JSONL_FILES = ("prompt_index.jsonl", "generations.jsonl", "activation_index.jsonl",
               "errors.jsonl")


@dataclass
class GenerationRecord:
    """One generation with its (optional) activations, as the worker hands it to persist."""

    row: dict[str, Any]
    """The ``generations.jsonl`` row."""
    acts: Any = None
    """(L, rows, H) array in the run dtype, or None when capture failed."""
    activation_row: dict[str, Any] = field(default_factory=dict)
    """Fields of the ``activation_index.jsonl`` row known before storing."""
    prompt_rows: int = 0
    response_rows: int = 0
    label: int | None = None


class WorkerDir:
    """Append-only writer of one worker's directory (``worker_{i}/``)."""

    def __init__(self, root: Path, *, worker_id: int, storage_format: str,
                 layer_ids: list[int], hidden_size: int, dtype: str) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.worker_id = worker_id
        self.writer = storage.open_writer(storage_format, root=self.root, layer_ids=layer_ids,
                                          hidden_size=hidden_size, dtype=dtype)
        self._files = {name: open(self.root / name, "a", encoding="utf-8")
                       for name in JSONL_FILES}

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self.writer.close()

    def persist_group(self, prompt_row: dict[str, Any], generations: list[GenerationRecord]
                      ) -> None:
        """Commit one prompt group durably, in the order the module docstring gives.

        Every row of the group gets the same fresh ``commit_id``, so that consolidation can
        tell two commits of one prompt apart (``--retry-failed``).
        """
        commit_id = uuid.uuid4().hex
        activation_rows = []
        for gen in generations:
            if gen.acts is None:
                continue
            key = gen.activation_row["activation_key"]
            label = -1 if gen.label is None else int(gen.label)
            location = self.writer.write(key, gen.acts, storage.SampleMeta(
                prompt_len=gen.prompt_rows, response_len=gen.response_rows, label=label))
            activation_rows.append({**gen.activation_row, **location,
                                    "worker_id": self.worker_id, "commit_id": commit_id})
        self.writer.commit()  # group commit: one fsync per store file for the whole group
        self._append("generations.jsonl", [{**g.row, "commit_id": commit_id}
                                           for g in generations])
        self._append("activation_index.jsonl", activation_rows)
        self._append("prompt_index.jsonl", [{**prompt_row, "commit_id": commit_id}])

    def record_error(self, error: dict[str, Any]) -> None:
        """Append one ``errors.jsonl`` row (seed 003 §12 fields)."""
        self._append("errors.jsonl", [error])

    def _append(self, name: str, rows: Iterable[dict[str, Any]]) -> None:
        lines = "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n"
                        for r in rows)
        if not lines:
            return
        f = self._files[name]
        f.write(lines)
        f.flush()
        os.fsync(f.fileno())


def read_jsonl_committed(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Rows of a worker JSONL file, ignoring a torn last line (no trailing newline).

    Returns (rows, byte length of the complete lines). A malformed line that is not the torn
    tail raises ValueError naming file and line.
    """
    if not path.exists():
        return [], 0
    data = path.read_bytes()
    complete = data.rfind(b"\n") + 1
    rows = []
    for lineno, line in enumerate(data[:complete].splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{lineno}: malformed JSON line ({exc.msg})") from None
    return rows, complete


def recover_worker_dir(root: Path, *, storage_format: str, layer_ids: list[int],
                       hidden_size: int, dtype: str) -> set[str]:
    """Roll a worker directory back to its last committed group; return committed prompt ids.

    Lines and activations of groups without a ``prompt_index.jsonl`` line are removed; a torn
    last line is cut off. Runs before the worker (re)opens the directory for appending.
    """
    root = Path(root)
    if not root.exists():
        return set()
    prompt_rows, _ = read_jsonl_committed(root / "prompt_index.jsonl")
    committed = {r["prompt_id"] for r in prompt_rows}
    commits = {r.get("commit_id") for r in prompt_rows}
    keep_keys: set[str] = set()
    for name in JSONL_FILES:
        path = root / name
        rows, complete = read_jsonl_committed(path)
        if name in ("generations.jsonl", "activation_index.jsonl"):
            kept = [r for r in rows if r.get("commit_id") in commits]
        else:
            kept = rows
        if name == "activation_index.jsonl":
            keep_keys = {r["activation_key"] for r in kept}
        if len(kept) != len(rows):
            log.warning("%s: rolled back %d line(s) of uncommitted groups", path,
                        len(rows) - len(kept))
            _rewrite_jsonl(path, kept)
        elif path.exists() and complete != path.stat().st_size:
            log.warning("%s: cut a torn last line", path)
            with open(path, "r+b") as f:
                f.truncate(complete)
                os.fsync(f.fileno())
    if (root / "activations").exists():
        writer = storage.open_writer(storage_format, root=root, layer_ids=layer_ids,
                                     hidden_size=hidden_size, dtype=dtype)
        try:
            writer.rollback(keep_keys)
        finally:
            writer.close()
    return committed


def _rewrite_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(path.suffix + ".partial")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)

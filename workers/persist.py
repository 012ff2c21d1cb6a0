"""Persisting prompt groups into a worker directory, and rolling back after a crash.

Commit order (docs/architecture.md, "The commit protocol"): activations written and fsynced → ``generations.jsonl`` and
``activation_index.jsonl`` lines appended and fsynced (both at once, while the store makes its
own commit point durable) → the group's ``prompt_index.jsonl`` line appended and fsynced (the
commit marker, once the store and both files are durable) → done reported. Groups that finish
while a commit is on the disk are committed together (group commit): one fsync per file per
commit, three waits in a row, however many groups it holds. A worker commits one call at a
time, so after a crash everything not covered by a ``prompt_index.jsonl`` line is a tail that
``recover_worker_dir`` removes.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Iterable
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hallulog.contracts import layout
from hallulog.contracts.errors import HallulogError
from hallulog.contracts.jsonl import JsonlAppender, cut_torn_tail, encode, iter_lines, truncate_to
from hallulog.contracts.writer_lock import fence_writer, hold_writer

from hallulog import storage

__all__ = ["WorkerDir", "GenerationRecord", "PersistBroken", "recover_worker_dir"]

log = logging.getLogger(__name__)


class PersistBroken(HallulogError, OSError):
    """A group failed and could not be rolled back: stop appending to this worker directory.

    The directory is consistent again once :func:`recover_worker_dir` has run (next run).
    """


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
    """Append-only writer of one worker's directory (``worker_{i}/``).

    It holds the directory's writer lock (``contracts/writer_lock.py``) from its start until
    :meth:`close`; a directory another live process writes is refused with ``WriterBusy``.
    """

    def __init__(
        self,
        root: Path,
        *,
        worker_id: int,
        storage_format: str,
        layer_ids: list[int],
        hidden_size: int,
        dtype: str,
    ) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.worker_id = worker_id
        self.writer_lock = hold_writer(self.root)  # before anything is opened for writing
        try:
            self.writer = storage.open_writer(
                storage_format,
                root=self.root,
                layer_ids=layer_ids,
                hidden_size=hidden_size,
                dtype=dtype,
            )
            self._files = {
                name: JsonlAppender(self.root / name) for name in layout.WORKER_JSONL_FILES
            }
        except BaseException:
            self.writer_lock.release()
            raise
        self.broken: str | None = None
        """Why the directory can no longer be appended to (a failed rollback), else None."""
        # the store's commit and one file's fsync run beside the group's own thread: two
        # threads kept for the run (starting two per group cost ~5 % of a worker's CPU)
        self._helpers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="persist")

    def close(self) -> None:
        """Sync and close the JSONL files and finalize the store (skipped when broken: the
        next run's recovery repairs the directory before anything reads it)."""
        errors = []
        for f in self._files.values():
            try:
                f.close()
            except OSError as exc:
                errors.append(exc)
        self._helpers.shutdown(wait=True)
        try:
            if self.broken is None:
                self.writer.close()
        finally:
            self.writer_lock.release()
        if errors:
            raise errors[0]

    def persist_group(
        self, prompt_row: dict[str, Any], generations: list[GenerationRecord]
    ) -> None:
        """Commit one prompt group durably: :meth:`persist_groups` of that one group."""
        self.persist_groups([(prompt_row, generations)])

    def persist_groups(self, groups: list[tuple[dict[str, Any], list[GenerationRecord]]]) -> None:
        """Commit prompt groups durably together, in the order the module docstring gives.

        Group commit: the groups share one fsync per file (a worker hands over every group that
        finished while the previous commit was on the disk). Each group's rows get their own
        fresh ``commit_id``, so that consolidation can tell two commits of one prompt apart
        (``--retry-failed``), and the groups' lines follow the order of their
        ``prompt_index.jsonl`` lines: a crash part way through the last append leaves a prefix
        of the groups committed, and recovery cuts the rest. A write that fails part way (EIO,
        ENOSPC, a store refusing a key) rolls every group of the call back in place before the
        error propagates: the JSONL files are cut to their offsets before the call and the store
        drops the call's samples, so the next commit follows the last committed one. When that
        rollback fails too, :class:`PersistBroken` is raised: the worker must stop, and the next
        run's :func:`recover_worker_dir` repairs the directory (the groups are a tail).
        """
        if self.broken is not None:
            raise PersistBroken(f"{self.root}: an earlier rollback failed ({self.broken})")
        marks = {name: f.tell() for name, f in self._files.items()}
        written: set[str] = set()  # keys these groups added (a refused duplicate is not one)
        store_commit = None
        try:
            generation_rows, activation_rows, prompt_rows = [], [], []
            for prompt_row, generations in groups:
                commit_id = uuid.uuid4().hex
                prompt_rows.append({**prompt_row, "commit_id": commit_id})
                for gen in generations:
                    generation_rows.append({**gen.row, "commit_id": commit_id})
                    if gen.acts is None:
                        continue
                    key = gen.activation_row["activation_key"]
                    label = -1 if gen.label is None else int(gen.label)
                    location = self.writer.write(
                        key,
                        gen.acts,
                        storage.SampleMeta(
                            prompt_len=gen.prompt_rows, response_len=gen.response_rows, label=label
                        ),
                    )
                    written.add(key)
                    activation_rows.append(
                        {
                            **gen.activation_row,
                            **location,
                            "worker_id": self.worker_id,
                            "commit_id": commit_id,
                        }
                    )
            # one fsync per store file for all the groups. While the disk works, the JSONL
            # lines are encoded; they are appended once the activation bytes are durable and
            # synced while the store writes its own commit point.
            durable = threading.Event()
            store_commit = self._helpers.submit(self.writer.commit, on_durable=durable.set)
            store_commit.add_done_callback(lambda _: durable.set())  # also when it fails
            lines = {
                layout.GENERATIONS: encode(generation_rows),
                layout.ACTIVATION_INDEX: encode(activation_rows),
            }
            durable.wait()
            if store_commit.done():
                store_commit.result()  # raises what the commit raised
            for name, data in lines.items():
                self._files[name].append_encoded(data)
            syncing = self._helpers.submit(self._files[layout.GENERATIONS].sync)
            try:
                self._files[layout.ACTIVATION_INDEX].sync()
            finally:
                syncing.result()
            store_commit.result()
            # the commit markers: only once the store and both files are durable
            self._append(layout.PROMPT_INDEX, prompt_rows)
        except Exception as exc:
            if store_commit is not None:
                futures.wait([store_commit])
            self._rollback(marks, written, exc)
            if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
                # os.write/fsync name no file: say which directory failed (e.g. a full disk)
                raise OSError(exc.errno, exc.strerror, str(self.root)) from exc
            raise
        except BaseException:  # e.g. a simulated crash: never leave the store thread running
            if store_commit is not None:
                futures.wait([store_commit])
            raise

    def _rollback(self, marks: dict[str, int], written: set[str], cause: Exception) -> None:
        """Undo a group that failed part way; on failure mark the directory broken.

        The store's committed keys are only listed here, on failure: listing them per group
        would cost O(run so far) for every commit.
        """
        try:
            for name in (layout.PROMPT_INDEX, layout.ACTIVATION_INDEX, layout.GENERATIONS):
                self._files[name].rollback(marks[name])
            self.writer.rollback(self.writer.committed_keys() - written)
        except Exception as exc:
            self.broken = f"{type(exc).__name__}: {exc}"
            log.error("%s: could not roll back a failed group (%s) after %s", self.root, exc, cause)
            raise PersistBroken(
                f"{self.root}: a group failed ({type(cause).__name__}: "
                f"{cause}) and rolling it back failed too ({exc}); the next "
                "run recovers the directory"
            ) from exc
        log.warning("%s: rolled back a group that failed to commit (%s)", self.root, cause)

    def record_error(self, error: dict[str, Any]) -> None:
        """Append one ``errors.jsonl`` row (seed 003 §12 fields)."""
        self._append(layout.ERRORS, [error])

    def _append(self, name: str, rows: Iterable[dict[str, Any]]) -> None:
        f = self._files[name]
        if f.append(rows):
            f.sync()


def recover_worker_dir(
    root: Path, *, storage_format: str, layer_ids: list[int], hidden_size: int, dtype: str
) -> set[str]:
    """Roll a worker directory back to its last committed group; return committed prompt ids.

    Every file is streamed once. Lines after the last line of a committed group (the rows of a
    group whose ``prompt_index.jsonl`` line never made it) are cut off by truncating the file at
    that offset, torn last lines likewise, and the activation store drops the entries those
    lines named. A malformed line before the tail stops recovery with an error naming the file
    and line; nothing is deleted then. Runs before the worker (re)opens the directory, behind
    its writer fence: a writer left by an earlier session is gone before anything is read
    (``contracts/writer_lock.py``).
    """
    root = Path(root)
    if not root.exists():
        return set()
    with fence_writer(root):
        return _recover(
            root,
            storage_format=storage_format,
            layer_ids=layer_ids,
            hidden_size=hidden_size,
            dtype=dtype,
        )


def _recover(
    root: Path, *, storage_format: str, layer_ids: list[int], hidden_size: int, dtype: str
) -> set[str]:
    committed: set[str] = set()
    commits: set[str] = set()
    for line in iter_lines(root / layout.PROMPT_INDEX):
        committed.add(line.row["prompt_id"])
        commits.add(line.row.get("commit_id"))
    cut_torn_tail(root / layout.PROMPT_INDEX)
    cut_torn_tail(root / layout.ERRORS)
    keep_keys: set[str] = set()
    for name in (layout.GENERATIONS, layout.ACTIVATION_INDEX):
        path = root / name
        keep_end, dropped = 0, 0
        kept_here: list[str] = []
        pending: list[str] = []  # keys since the last committed line: kept if one follows
        for line in iter_lines(path):
            pending.append(line.row.get("activation_key"))
            if line.row.get("commit_id") in commits:
                keep_end, dropped = line.end, 0
                kept_here.extend(pending)
                pending.clear()
            else:
                dropped += 1
        if path.exists() and truncate_to(path, keep_end):
            log.warning("%s: rolled back %d line(s) of an uncommitted group", path, dropped)
        if name == layout.ACTIVATION_INDEX:
            keep_keys = set(kept_here)
    if os.path.exists(storage.store_dir(root)):
        writer = storage.open_writer(
            storage_format, root=root, layer_ids=layer_ids, hidden_size=hidden_size, dtype=dtype
        )
        try:
            writer.rollback(keep_keys)
        finally:
            writer.close()
    return committed

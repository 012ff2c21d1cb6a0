"""Which commit of each prompt consolidation keeps, from a stream over the worker files.

A worker writes one prompt group at a time (workers/persist.py): its ``generations.jsonl`` and
``activation_index.jsonl`` rows, then the ``prompt_index.jsonl`` line that commits them, all with
one ``commit_id``. So the rows of one commit are adjacent, and commits appear in the same order
in all three files (rows of groups that never committed may sit in between). This module reads
a worker's ``prompt_index.jsonl`` and ``generations.jsonl`` in lockstep and keeps, per committed
prompt row, a few numbers (no rows):

- a commit is *complete* when its generations carry exactly the sample ids ``0..K``;
- of the complete commits of one prompt, over all workers, the one with the latest
  ``completed_at`` is kept (ties: the later worker, then the later line), e.g. after
  ``hallulog retry``.

:class:`KeptCommits` then answers, for any ``(prompt_id, commit_id)`` run met while streaming a
worker's files again, whether it is kept and where it sits in the worker's commit order.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from hallulog.contracts import layout
from hallulog.contracts.jsonl import Line, iter_rows

__all__ = [
    "id_rows",
    "commit_key",
    "runs",
    "MaskLookup",
    "WorkerCommits",
    "scan_worker",
    "pick_commits",
    "KeptCommits",
    "RunCursor",
]

log = logging.getLogger(__name__)


def commit_key(row: dict[str, Any]) -> int:
    """64-bit key of a row's ``(prompt_id, commit_id)`` (stable within one process)."""
    return hash((_text(row.get("prompt_id")), _text(row.get("commit_id"))))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


_HEAD = re.compile(rb'\{"prompt_id":"([0-9a-f]{16})","sample_id":(0|[1-9][0-9]{0,8}),')
_TAIL = re.compile(rb',"commit_id":"([0-9a-f]{32})"\}\n\Z')


def id_rows(path: Path) -> Iterator[dict[str, Any]]:
    """``{prompt_id, sample_id, commit_id}`` of each committed row, without parsing the rest.

    Rows written by the worker (hallulog.contracts.jsonl.dumps: compact, keys in the worker's order)
    start with ``{"prompt_id":"…","sample_id":N,`` and end with ``,"commit_id":"…"}``; those
    are read from the bytes (no unescaped quote can sit inside a JSON string, so the pieces
    are the top-level members). Any other line is parsed; malformed ones are skipped (with a
    warning), as ``iter_rows(..., malformed="skip")`` does.
    """
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return
    with f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.endswith(b"\n"):
                return  # torn tail
            head, tail = _HEAD.match(raw), _TAIL.search(raw)
            if head is not None and tail is not None:
                yield {
                    "prompt_id": head.group(1).decode(),
                    "sample_id": int(head.group(2)),
                    "commit_id": tail.group(1).decode(),
                }
                continue
            if raw.isspace():
                continue
            try:
                row = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                row = None
            if isinstance(row, dict):
                yield row
            else:
                log.warning("%s:%d: not a JSON object; line skipped", path, lineno)


def runs(rows: Iterable[dict[str, Any]]) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """Consecutive rows of one commit: ``(commit_key, rows)``."""
    for key, group in itertools.groupby(rows, key=commit_key):
        yield key, list(group)


def _sample_mask(rows: list[dict[str, Any]], k: int) -> int:
    """Bit i set for sample id i in ``0..k``; -1 when a sample id is outside that range."""
    mask = 0
    for row in rows:
        sid = row.get("sample_id")
        if not isinstance(sid, int) or isinstance(sid, bool) or not 0 <= sid <= k:
            return -1
        mask |= 1 << sid
    return mask


class MaskLookup:
    """Sample-id masks of the commit runs of one file, looked up in commit order.

    ``get(key)`` reads runs forward until the run of ``key``; runs passed on the way are held as
    one int each (rows of groups that never committed, or of a commit looked up later).
    """

    def __init__(self, rows: Iterable[dict[str, Any]], k: int) -> None:
        self._runs = runs(rows)
        self._k = k
        self._ahead: dict[int, int] = {}
        self._last: tuple[int, int] | None = None

    def get(self, key: int) -> int:
        """The mask of ``key``'s run (0 when the file has none; -1: a sample id out of range)."""
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        mask = self._ahead.pop(key, None)
        if mask is None:
            mask = 0
            for run_key, rows in self._runs:
                run_mask = _sample_mask(rows, self._k)
                if run_key == key:
                    mask = run_mask
                    break
                prev = self._ahead.get(run_key, 0)
                self._ahead[run_key] = -1 if -1 in (run_mask, prev) else prev | run_mask
        self._last = (key, mask)
        return mask


@dataclass
class WorkerCommits:
    """Per committed prompt row of one worker, in file order (compact arrays)."""

    prompt_ids: np.ndarray  # bytes, one per prompt row
    stamps: np.ndarray  # completed_at as bytes ("" when absent)
    keys: np.ndarray  # uint64 commit keys
    complete: np.ndarray  # bool


def scan_worker(wdir: Path, k: int) -> WorkerCommits:
    """One pass over ``prompt_index.jsonl`` and, in lockstep, ``generations.jsonl``.

    Generation runs read ahead of the prompt row that commits them (rows of groups that never
    committed) are held as one int each until their prompt row comes, if ever.
    """
    full = (1 << (k + 1)) - 1
    gens = MaskLookup(id_rows(wdir / layout.GENERATIONS), k)
    pids: list[bytes] = []
    stamps: list[bytes] = []
    keys: list[int] = []
    complete: list[bool] = []
    for row in iter_rows(wdir / layout.PROMPT_INDEX, malformed="skip"):
        key = commit_key(row)
        mask = gens.get(key)
        pids.append(_text(row.get("prompt_id")).encode())
        stamp = row.get("completed_at") or ""
        stamps.append(stamp.encode() if isinstance(stamp, str) else repr(stamp).encode())
        keys.append(key & 0xFFFFFFFFFFFFFFFF)
        complete.append(mask == full)
    return WorkerCommits(
        np.array(pids, dtype=bytes),
        np.array(stamps, dtype=bytes),
        np.array(keys, dtype=np.uint64),
        np.array(complete, dtype=bool),
    )


def pick_commits(scans: list[WorkerCommits]) -> list[np.ndarray]:
    """Per worker, a bool per prompt row: is this the commit to keep for its prompt."""
    sizes = [len(s.keys) for s in scans]
    chosen = [np.zeros(n, dtype=bool) for n in sizes]
    if not sum(sizes):
        return chosen
    worker = np.concatenate([np.full(n, i, dtype=np.int64) for i, n in enumerate(sizes)])
    line = np.concatenate([np.arange(n, dtype=np.int64) for n in sizes])
    pids = np.concatenate([s.prompt_ids for s in scans])
    stamps = np.concatenate([s.stamps for s in scans])
    ok = np.concatenate([s.complete for s in scans])
    idx = np.flatnonzero(ok)
    if not len(idx):
        return chosen
    order = idx[np.lexsort((line[idx], worker[idx], stamps[idx], pids[idx]))]
    sorted_pids = pids[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = sorted_pids[1:] != sorted_pids[:-1]
    for pos in order[last]:
        chosen[worker[pos]][line[pos]] = True
    return chosen


class KeptCommits:
    """The kept commits of one worker: commit key → position in the worker's commit order."""

    def __init__(self, scan: WorkerCommits, chosen: np.ndarray) -> None:
        lines = np.flatnonzero(chosen)
        keys = scan.keys[lines]
        order = np.argsort(keys, kind="stable")
        self._keys = keys[order]
        self._lines = lines[order]
        self.count = len(lines)

    def position(self, key: int) -> int | None:
        """The prompt_index row number (0-based, among rows read) of kept commit ``key``."""
        key &= 0xFFFFFFFFFFFFFFFF
        i = int(np.searchsorted(self._keys, np.uint64(key)))
        if i < len(self._keys) and int(self._keys[i]) == key:
            return int(self._lines[i])
        return None


class RunCursor:
    """Hands out the rows of kept commits of one file, in the worker's commit order.

    ``take(line)`` returns the lines of the kept commit whose prompt row is ``line`` (an empty
    list when this file has none, e.g. no activations), dropping the runs of commits that are not
    kept on the way.
    """

    def __init__(self, lines: Iterable[Line], kept: KeptCommits) -> None:
        self._runs = (
            (key, list(group))
            for key, group in itertools.groupby(lines, key=lambda line: commit_key(line.row))
        )
        self._kept = kept
        self._peeked: tuple[int, list[Line]] | None = None

    def take(self, line: int) -> list[Line]:
        while True:
            if self._peeked is None:
                nxt = next(self._runs, None)
                if nxt is None:
                    return []
                pos = self._kept.position(nxt[0])
                if pos is None:
                    continue  # not a kept commit
                self._peeked = (pos, nxt[1])
            pos, rows = self._peeked
            if pos > line:
                return []  # this file has no rows of that commit
            self._peeked = None
            if pos == line:
                return rows
            # pos < line: a kept commit out of the prompt_index order; the caller checks counts

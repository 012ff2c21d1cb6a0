"""Segments: a staging root's committed work as immutable objects in a bucket, and back.

``SegmentShipper`` ships each worker directory's newly committed byte ranges (marker first:
``prompt_index.jsonl``, then the lines and store bytes its markers cover) as create-only
objects named by file and offsets, then a segment manifest, the commit point; ``restore_staging``
rebuilds the worker directories from the manifests. The run around it, and the layout of the
objects: ``orchestrator/remote_run.py``, docs/object-storage.md.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from contracts import layout
from contracts.jsonl import parse_line
from storage.object_store import (
    CHECKSUM_ATTRIBUTE,
    Bucket,
    ObjectExistsError,
    ObjectStoreError,
    crc32c_hex,
)
from storage.packed_layout import COMMIT_LOG

__all__ = ["RUN_PREFIX", "SEGMENT_FORMAT", "WorkerState", "SegmentShipper", "restore_staging"]

log = logging.getLogger(__name__)

RUN_PREFIX = ".hallulog-run"
"""Key prefix (under the run's prefix) of the live run's objects: segments, the manifest."""
SEGMENT_FORMAT = "hallulog.segment"
STORE_DIR = "activations"
COMMIT_LOG_REL = f"{STORE_DIR}/{COMMIT_LOG}"
_RESET_FILES = (layout.CHECKPOINT, layout.COMPLETION_LOG)


def _crc(data) -> str:
    import google_crc32c

    return crc32c_hex(google_crc32c.extend(0, bytes(data)))


@dataclass
class WorkerState:
    """What of one worker directory is in the bucket: each file's shipped end, the committed
    commit ids and activation keys up to there, the next segment number."""

    name: str
    seq: int = 0
    ends: dict[str, int] = field(default_factory=dict)
    commits: set[str] = field(default_factory=set)
    keys: set[str] = field(default_factory=set)
    shard_ends: dict[str, int] = field(default_factory=dict)


def _read(path: Path, start: int, end: int | None = None) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read() if end is None else f.read(end - start)
    except FileNotFoundError:
        return b""


def _complete_lines(data: bytes, start: int):
    """``(end offset, parsed row)`` of each complete line of ``data`` read from ``start``."""
    pos = 0
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            return
        raw = data[pos:nl]
        pos = nl + 1
        row = None
        if raw.strip():
            try:
                row = parse_line(raw)
            except (ValueError, UnicodeDecodeError):  # recovery refuses it on resume
                row = None
        yield start + pos, row


def _advance(wdir: Path, st: WorkerState) -> tuple[WorkerState, dict[str, int], list[str]]:
    """The worker directory's committed ends now (read in commit-marker-first order, so every
    line and byte a marker covers is on disk when read), as a new state; and the prompt ids the
    new range commits."""
    new = dataclasses.replace(
        st,
        ends=dict(st.ends),
        commits=set(st.commits),
        keys=set(st.keys),
        shard_ends=dict(st.shard_ends),
    )
    prompt_ids: list[str] = []
    start = st.ends.get(layout.PROMPT_INDEX, 0)
    for end, row in _complete_lines(_read(wdir / layout.PROMPT_INDEX, start), start):
        new.ends[layout.PROMPT_INDEX] = end
        if isinstance(row, dict):
            new.commits.add(row.get("commit_id"))
            prompt_ids.append(row.get("prompt_id"))
    for name in (layout.GENERATIONS, layout.ACTIVATION_INDEX):
        start = st.ends.get(name, 0)
        pending: list[dict] = []
        for end, row in _complete_lines(_read(wdir / name, start), start):
            pending.append(row if isinstance(row, dict) else {})
            if isinstance(row, dict) and row.get("commit_id") in new.commits:
                new.ends[name] = end
                if name == layout.ACTIVATION_INDEX:
                    for r in pending:
                        if r.get("activation_key") is not None:
                            new.keys.add(r["activation_key"])
                        if r.get("file_path") and r.get("byte_offset") is not None:
                            stop = int(r["byte_offset"]) + int(r["size_bytes"])
                            rel = str(r["file_path"])
                            new.shard_ends[rel] = max(new.shard_ends.get(rel, 0), stop)
                pending = []
    start = st.ends.get(layout.ERRORS, 0)
    for end, _ in _complete_lines(_read(wdir / layout.ERRORS, start), start):
        new.ends[layout.ERRORS] = end
    start = st.ends.get(COMMIT_LOG_REL, 0)
    header = start == 0  # the store's first line describes it: shipped with its first record
    for end, row in _complete_lines(_read(wdir / COMMIT_LOG_REL, start), start):
        if header or (isinstance(row, dict) and row.get("key") in new.keys):
            if not header or new.keys:
                new.ends[COMMIT_LOG_REL] = end
        header = False
    for rel, stop in new.shard_ends.items():
        new.ends[rel] = max(new.ends.get(rel, 0), stop)
    return new, {k: v for k, v in new.ends.items() if v > st.ends.get(k, 0)}, prompt_ids


class SegmentShipper:
    """Ships the staging root's committed work as segments (module docstring); ``start()`` a
    thread shipping every ``interval`` seconds, ``stop()`` it after one last pass."""

    def __init__(
        self, root: Path, bucket: Bucket, states: dict[str, WorkerState], interval: float
    ) -> None:
        self.root, self.bucket, self.states, self.interval = Path(root), bucket, states, interval
        self.nonce = uuid.uuid4().hex[:12]
        self.segments = 0
        self._manifest_shipped = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="segment-shipper", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.ship()
                self.error = None
            except (ObjectStoreError, OSError) as exc:  # retried next interval
                self.error = exc
                log.error(
                    "shipping segments to %s: %s (retrying in %.0f s)",
                    self.bucket.url,
                    exc,
                    self.interval,
                )

    def stop(self) -> None:
        """Stop the thread and ship what is committed now (raises what that last pass raised)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.ship()

    def ship(self) -> int:
        """One pass: a segment for each worker directory with newly committed bytes."""
        with self._lock:
            self._ship_manifest()
            written = 0
            for wdir in sorted(self.root.glob("worker_*")):
                if not wdir.is_dir():
                    continue
                st = self.states.setdefault(wdir.name, WorkerState(wdir.name))
                new, grown, prompt_ids = _advance(wdir, st)
                if not grown:
                    continue
                self._ship_segment(wdir, st, new, grown, prompt_ids)
                new.seq = st.seq + 1
                self.states[wdir.name] = new
                written += 1
            self.segments += written
            return written

    def _ship_manifest(self) -> None:
        if self._manifest_shipped:
            return
        path = self.root / layout.MANIFEST
        if not path.is_file():
            return
        data = path.read_bytes()
        # the first session's manifest stays (the run id); a resumed one differs only in time
        self.bucket.put_create(
            f"{RUN_PREFIX}/{layout.MANIFEST}", data, {CHECKSUM_ATTRIBUTE: _crc(data)}
        )
        self._manifest_shipped = True

    def _put(self, key: str, data: bytes, crc: str) -> None:
        if self.bucket.put_create(key, data, {CHECKSUM_ATTRIBUTE: crc}):
            return
        head = self.bucket.head(key)  # a retried PUT whose first try landed: compare
        size = int(head["size"]) if head else -1
        got = self.bucket.attributes(key, size).get(CHECKSUM_ATTRIBUTE) if head else None
        if size != len(data) or got != crc:
            raise ObjectExistsError(
                f"{self.bucket.display(key)} exists with other bytes; refusing to overwrite "
                "it (is another run writing to this prefix?)"
            )

    def _ship_segment(
        self,
        wdir: Path,
        st: WorkerState,
        new: WorkerState,
        grown: dict[str, int],
        prompt_ids: list[str],
    ) -> None:
        base = f"{RUN_PREFIX}/segments/{wdir.name}"
        pieces = []
        for rel, end in sorted(grown.items()):
            start = st.ends.get(rel, 0)
            data = _read(wdir / rel, start, end)
            if len(data) != end - start:
                raise ObjectStoreError(
                    f"{wdir / rel}: holds {start + len(data)} bytes, {end} are committed"
                )
            crc = _crc(data)
            key = f"{base}/{st.seq:08d}-{self.nonce}/{rel}.{start}-{end}"
            self._put(key, data, crc)
            pieces.append({"path": rel, "start": start, "end": end, "key": key, "crc32c": crc})
        doc = {
            "format": SEGMENT_FORMAT,
            "schema_version": 1,
            "worker": wdir.name,
            "seq": st.seq,
            "ends": dict(sorted(new.ends.items())),
            "pieces": pieces,
            "prompt_ids": prompt_ids,
        }
        body = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
        key = f"{base}/{st.seq:08d}.json"
        if not self.bucket.put_create(key, body, {CHECKSUM_ATTRIBUTE: _crc(body)}):
            if self.bucket.get_bytes(key) != body:
                raise ObjectExistsError(
                    f"{self.bucket.display(key)} was written by another run; refusing to "
                    "overwrite it (two runs on one prefix?)"
                )


def _segment_manifests(bucket: Bucket) -> dict[str, list[str]]:
    """``worker name -> [manifest keys in seq order]``; a gap in the numbers is an error."""
    found: dict[str, dict[int, str]] = {}
    for key in bucket.list(f"{RUN_PREFIX}/segments/"):
        parts = key.split("/")
        if len(parts) == 4 and parts[3].endswith(".json") and parts[3][:-5].isdigit():
            found.setdefault(parts[2], {})[int(parts[3][:-5])] = key
    out = {}
    for worker, by_seq in found.items():
        if sorted(by_seq) != list(range(len(by_seq))):
            raise ObjectStoreError(
                f"{bucket.display(f'{RUN_PREFIX}/segments/{worker}')}: "
                f"segment numbers {sorted(by_seq)} are not 0..n-1"
            )
        out[worker] = [by_seq[i] for i in range(len(by_seq))]
    return out


def _segment_doc(bucket: Bucket, key: str) -> dict:
    try:
        doc = json.loads(bucket.get_bytes(key))
        if doc.get("format") != SEGMENT_FORMAT:
            raise ValueError(f"format is {doc.get('format')!r}, not {SEGMENT_FORMAT!r}")
        return doc
    except (ValueError, AttributeError) as exc:
        raise ObjectStoreError(
            f"{bucket.display(key)}: unreadable segment manifest ({exc})"
        ) from None


def restore_staging(root: Path, bucket: Bucket) -> dict[str, WorkerState]:
    """Rebuild the staging root's worker directories from the bucket's segments (module
    docstring); the states the shipper continues from."""
    root.mkdir(parents=True, exist_ok=True)
    for wdir in root.glob("worker_*"):
        if wdir.is_dir():
            shutil.rmtree(wdir)
    for name in _RESET_FILES:
        (root / name).unlink(missing_ok=True)
    manifest_key = f"{RUN_PREFIX}/{layout.MANIFEST}"
    if bucket.head(manifest_key) is not None:
        (root / layout.MANIFEST).write_bytes(bucket.get_bytes(manifest_key))
    states: dict[str, WorkerState] = {}
    pieces_restored = 0
    for worker, keys in sorted(_segment_manifests(bucket).items()):
        wdir = root / worker
        sizes: dict[str, int] = {}
        for key in keys:
            for piece in _segment_doc(bucket, key)["pieces"]:
                rel = piece["path"]
                if rel.startswith("/") or ".." in rel.split("/"):
                    raise ObjectStoreError(f"{bucket.display(key)}: path {rel!r} leaves the tree")
                path = wdir / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                if sizes.get(rel, 0) != piece["start"]:
                    raise ObjectStoreError(
                        f"{bucket.display(piece['key'])}: starts at "
                        f"{piece['start']}, the file has {sizes.get(rel, 0)}"
                    )
                with open(path, "ab") as f:
                    size, crc = bucket.download(piece["key"], f)
                    f.flush()
                    os.fsync(f.fileno())
                if size != piece["end"] - piece["start"] or crc32c_hex(crc) != piece["crc32c"]:
                    raise ObjectStoreError(
                        f"{bucket.display(piece['key'])}: read {size} bytes "
                        f"with CRC-32C {crc32c_hex(crc)}, the segment says "
                        f"{piece['end'] - piece['start']}, {piece['crc32c']}"
                    )
                sizes[rel] = piece["end"]
                pieces_restored += 1
        st, _, _ = _advance(wdir, WorkerState(worker))
        if st.ends != sizes:
            raise ObjectStoreError(
                f"{bucket.display(keys[-1])}: the restored files end at "
                f"{sizes}, their committed ends are {st.ends}"
            )
        st.seq = len(keys)
        states[worker] = st
    if states:
        log.info(
            "%s: restored %d worker dir(s) from %d piece(s) of %d segment(s)",
            bucket.url,
            len(states),
            pieces_restored,
            sum(s.seq for s in states.values()),
        )
    return states

"""Segments: a worker directory's committed work as immutable objects in a bucket (the format).

A worker directory on an ``s3://`` artifact root is written on local disk (commit markers,
recovery and rollback as on any root) and shipped in *segments*: per file, the byte range
between the last shipped end and the committed end, as one create-only object
``.hallulog-run/segments/worker_{i}/{seq:08d}-{nonce}/{file}.{start}-{end}``, then the segment's
manifest ``.hallulog-run/segments/worker_{i}/{seq:08d}.json`` (each file's committed end, the
pieces with their CRC-32C, the prompt ids it commits), create-only and written last: the
segment's commit point. Pieces without a manifest (a process killed between the two) are
ignored. A file written once and never appended to is a *whole* piece ``{file}.whole-{size}``,
written by the restore as it is: an ``npy`` activation file, a committed sample's chunk files of
a ``zarr`` store, and that store's metadata (``.zarray``, ``.zgroup``, ``.zattrs``,
``zarr.json``), shipped again whenever it has changed (zarr rewrites it in place when the array
grows), read after the commit log, so that it describes at least every committed sample.

A segment number is taken once (create-only), so two writers of one worker directory cannot
both continue it; a *fence* is a manifest without pieces that takes the next number, after which
nothing shipped by an earlier writer can follow (``remote/restore.py``). Every manifest carries
the *epoch* of the lease its writer's session held (``remote/epochs.py``): a segment of an older
epoch than a fence before it is never restored.

A *checkpoint* is a manifest that restates the whole directory (``"checkpoint": true``: every
file's pieces from its start, the prompt ids and line counts of everything before it), written at
the chain's next number by its writer (``remote/compact.py``); a restore reads the chain from its
latest checkpoint on, and what the checkpoint supersedes is deleted. A piece may lie inside a
larger object (``"offset"``, ``"object_size"``: a *pack* of small pieces).

The root chain (:data:`ROOT_CHAIN`) holds the root's own append-only file, ``labels.jsonl``
(the judge's labels), its committed part being its whole lines.

This module says what is committed (:func:`advance`, read commit marker first) and names the
keys; shipping is ``remote/shipper.py``, restoring ``remote/restore.py``.
docs/object-storage.md.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from hallulog.contracts import layout
from hallulog.contracts.jsonl import parse_line
from hallulog.remote.client import ObjectStoreError
from hallulog.storage.registry import commit_records, committed_files

__all__ = [
    "RUN_PREFIX",
    "SEGMENTS",
    "SEGMENT_FORMAT",
    "SCHEMA_VERSION",
    "COMMIT_LOG_REL",
    "ROOT_CHAIN",
    "ROOT_FILES",
    "WorkerState",
    "advance",
    "chain_dir",
    "manifest_key",
    "manifest_seq",
    "piece_key",
    "pack_key",
    "read_range",
    "segment_doc",
]

RUN_PREFIX = ".hallulog-run"
"""Key prefix (under the run's prefix) of the live run's objects: segments, the manifest."""
SEGMENTS = f"{RUN_PREFIX}/segments"
SEGMENT_FORMAT = "hallulog.segment"
SCHEMA_VERSION = 2
"""1: no epoch, no checkpoint, no line counts (read as epoch 0)."""
ROOT_CHAIN = "_root"
"""The chain of the root's own files (``labels.jsonl``), beside the ``worker_{i}`` chains."""
ROOT_FILES = (layout.LABELS,)
STORE_DIR = "activations"
(_COMMIT_RECORD,) = commit_records()  # the stores' commit log (packed, zarr: one name)
COMMIT_LOG_REL = f"{STORE_DIR}/{_COMMIT_RECORD}"


def manifest_key(worker: str, seq: int) -> str:
    return f"{SEGMENTS}/{worker}/{seq:08d}.json"


def manifest_seq(key: str) -> tuple[str, int] | None:
    """``(chain, seq)`` of a segment manifest's key, None for any other key."""
    parts = key.split("/")
    if len(parts) == 4 and parts[3].endswith(".json") and parts[3][:-5].isdigit():
        return parts[2], int(parts[3][:-5])
    return None


def chain_dir(root: Path, name: str) -> Path:
    """The directory a chain restores into: ``root/worker_{i}``, or the root itself."""
    return Path(root) if name == ROOT_CHAIN else Path(root) / name


def pack_key(worker: str, seq: int, nonce: str, index: int) -> str:
    return f"{SEGMENTS}/{worker}/{seq:08d}-{nonce}/pack-{index:04d}"


def segment_doc(worker: str, seq: int, epoch: int, **fields) -> dict:
    """A segment manifest (``pieces``, ``ends``, ``prompt_ids``, ``lines``, ``fence``,
    ``checkpoint`` ... as given)."""
    return {
        "format": SEGMENT_FORMAT,
        "schema_version": SCHEMA_VERSION,
        "worker": worker,
        "seq": seq,
        "epoch": epoch,
        "pieces": [],
        "prompt_ids": [],
        **fields,
    }


def piece_key(worker: str, seq: int, nonce: str, rel: str, start: int, end: int, whole: bool):
    span = f"whole-{end}" if whole else f"{start}-{end}"
    return f"{SEGMENTS}/{worker}/{seq:08d}-{nonce}/{rel}.{span}"


@dataclass
class WorkerState:
    """What of one worker directory is in the bucket: each appended file's shipped end, the
    committed commit ids and activation keys up to there, the next segment number."""

    name: str
    seq: int = 0
    ends: dict[str, int] = field(default_factory=dict)
    commits: set[str] = field(default_factory=set)
    keys: set[str] = field(default_factory=set)
    shard_ends: dict[str, int] = field(default_factory=dict)
    metadata: dict[str, int] = field(default_factory=dict)
    """A zarr store's metadata files as shipped: path -> CRC-32."""
    lines: dict[str, int] = field(default_factory=dict)
    """Committed lines up to ``ends``: prompts, generations, errors (a status reads them)."""
    chain: list[dict] = field(default_factory=list)
    """The chain's manifests from its latest checkpoint on, as restored and shipped since (what
    a compaction restates)."""

    def copy(self) -> WorkerState:
        return dataclasses.replace(
            self,
            ends=dict(self.ends),
            commits=set(self.commits),
            keys=set(self.keys),
            shard_ends=dict(self.shard_ends),
            metadata=dict(self.metadata),
            lines=dict(self.lines),
            chain=list(self.chain),
        )

    @property
    def since_checkpoint(self) -> int:
        """Manifests shipped after the chain's latest checkpoint (or its start)."""
        return len(self.chain) - (1 if self.chain and self.chain[0].get("checkpoint") else 0)


def read_range(path: Path, start: int, end: int | None = None) -> bytes:
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


def _index_rows(new: WorkerState, rows: list[dict], whole: set[str], in_array: set[int]) -> None:
    """Activation index rows of a committed group: their keys, and where their bytes are (a
    range of an appended shard, a file of its own, or a sample of an array, by the location
    fields of the index line, docs/formats/)."""
    for r in rows:
        if r.get("activation_key") is not None:
            new.keys.add(r["activation_key"])
        rel = r.get("file_path")
        if not rel:
            continue
        if r.get("zarr_index") is not None:  # a sample of an array: its chunk files
            in_array.add(int(r["zarr_index"]))
        elif r.get("byte_offset") is not None:  # packed: a range of an append-only shard
            stop = int(r["byte_offset"]) + int(r["size_bytes"])
            new.shard_ends[str(rel)] = max(new.shard_ends.get(str(rel), 0), stop)
        else:  # a file of its own, written once before its commit
            whole.add(str(rel))


def advance(wdir: Path, st: WorkerState) -> tuple[WorkerState, dict[str, int], set[str], list[str]]:
    """The worker directory's committed state now, as a new state; the appended files' new
    committed ends (those past the state's), the whole files newly committed, and the prompt ids
    the new range commits.

    Files are read commit marker first (``prompt_index.jsonl``), so every line and byte a marker
    covers is on disk when read; a commit in flight (lines and bytes without their marker) is
    left for the next pass.
    """
    new = st.copy()
    whole: set[str] = set()
    in_array: set[int] = set()
    prompt_ids: list[str] = []
    if st.name == ROOT_CHAIN:  # the root's own files: their whole lines
        for name in ROOT_FILES:
            start = st.ends.get(name, 0)
            for end, _ in _complete_lines(read_range(wdir / name, start), start):
                new.ends[name] = end
                new.lines[name] = new.lines.get(name, 0) + 1
        grown = {k: v for k, v in new.ends.items() if v > st.ends.get(k, 0)}
        return new, grown, whole, prompt_ids
    start = st.ends.get(layout.PROMPT_INDEX, 0)
    for end, row in _complete_lines(read_range(wdir / layout.PROMPT_INDEX, start), start):
        new.ends[layout.PROMPT_INDEX] = end
        new.lines[layout.PROMPT_INDEX] = new.lines.get(layout.PROMPT_INDEX, 0) + 1
        if isinstance(row, dict):
            new.commits.add(row.get("commit_id"))
            prompt_ids.append(row.get("prompt_id"))
    for name in (layout.GENERATIONS, layout.ACTIVATION_INDEX):
        start = st.ends.get(name, 0)
        pending: list[dict] = []
        for end, row in _complete_lines(read_range(wdir / name, start), start):
            pending.append(row if isinstance(row, dict) else {})
            if isinstance(row, dict) and row.get("commit_id") in new.commits:
                new.ends[name] = end
                new.lines[name] = new.lines.get(name, 0) + len(pending)
                if name == layout.ACTIVATION_INDEX:
                    _index_rows(new, pending, whole, in_array)
                pending = []
    start = st.ends.get(layout.ERRORS, 0)
    for end, _ in _complete_lines(read_range(wdir / layout.ERRORS, start), start):
        new.ends[layout.ERRORS] = end
        new.lines[layout.ERRORS] = new.lines.get(layout.ERRORS, 0) + 1
    start = st.ends.get(COMMIT_LOG_REL, 0)
    header = start == 0  # the store's first line describes it: shipped with its first record
    for end, row in _complete_lines(read_range(wdir / COMMIT_LOG_REL, start), start):
        if header or (isinstance(row, dict) and row.get("key") in new.keys):
            if not header or new.keys:
                new.ends[COMMIT_LOG_REL] = end
        header = False
    for rel, stop in new.shard_ends.items():
        new.ends[rel] = max(new.ends.get(rel, 0), stop)
    if in_array or new.metadata:
        _array_files(wdir, in_array, new, whole)
    grown = {k: v for k, v in new.ends.items() if v > st.ends.get(k, 0)}
    return new, grown, whole, prompt_ids


def _metadata_crc(path: Path) -> int | None:
    """CRC-32 of a store's metadata file, None when absent; an error while it is half written."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        json.loads(data)
    except ValueError:  # zarr rewrites it in place: the next pass reads it whole
        raise ObjectStoreError(f"{path}: being rewritten; shipped at the next pass") from None
    return zlib.crc32(data)


def _array_files(wdir: Path, samples: set[int], new: WorkerState, whole: set[str]) -> None:
    """A store of arrays' part of a segment (zarr; the storage registry's ``committed_files``):
    the chunk files of the newly committed samples, and the metadata files changed since they
    were last shipped (read after the commit log)."""
    data, metadata = committed_files(wdir, samples)
    whole.update(str(Path(p).relative_to(wdir)) for p in data)
    for path in map(Path, metadata):
        rel = str(path.relative_to(wdir))
        crc = _metadata_crc(path)
        if crc is not None and new.metadata.get(rel) != crc:
            new.metadata[rel] = crc
            whole.add(rel)

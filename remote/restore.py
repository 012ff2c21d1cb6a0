"""Rebuild worker directories from a bucket's segments, and fence a worker's segment chain.

:func:`restore_staging` makes a staging root's worker directories exactly the committed prefix
the bucket holds (``remote/segments.py``): each file's pieces in order, each checked against
its size and CRC-32C, the ranges contiguous; a gap in the segment numbers is refused. Bytes
already on disk are kept where they equal the pieces (a node that restarts re-reads its own
disk, not the bucket); the rest is downloaded, several pieces at once, each into its place.
Whatever else a restored directory holds (a tail committed after the last segment, a store
manifest) is removed: the bucket is the truth.

:func:`fence_chain` takes the next segment number of a worker with a manifest that has no
pieces: an earlier writer of that directory (a Ray actor cut off from the driver, or of a
driver that died) can ship nothing after it; the prompt ids the chain committed until then are
final.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hallulog.contracts import layout
from hallulog.remote.client import Bucket, ObjectStoreError, crc32c_hex
from hallulog.remote.segments import (
    RUN_PREFIX,
    SEGMENT_FORMAT,
    SEGMENTS,
    WorkerState,
    advance,
    manifest_key,
)

__all__ = ["segment_chains", "read_segment", "fence_chain", "chain_prompt_ids", "restore_staging"]

log = logging.getLogger(__name__)

DOWNLOADS_AT_ONCE = 16
_CHUNK = 8 << 20
_RESET_FILES = (layout.CHECKPOINT, layout.COMPLETION_LOG)
_KEEP = (layout.WRITER_LOCK,)
"""Files of a worker directory that are not its data (left in place by a restore)."""


def segment_chains(bucket: Bucket, worker: str | None = None) -> dict[str, list[str]]:
    """``worker name -> [manifest keys in seq order]`` (one worker's with ``worker``); a gap
    in the numbers is an error."""
    found: dict[str, dict[int, str]] = {}
    prefix = f"{SEGMENTS}/{worker}/" if worker else f"{SEGMENTS}/"
    for key in bucket.list(prefix):
        parts = key.split("/")
        if len(parts) == 4 and parts[3].endswith(".json") and parts[3][:-5].isdigit():
            found.setdefault(parts[2], {})[int(parts[3][:-5])] = key
    out = {}
    for name, by_seq in found.items():
        if sorted(by_seq) != list(range(len(by_seq))):
            raise ObjectStoreError(
                f"{bucket.display(f'{SEGMENTS}/{name}')}: "
                f"segment numbers {sorted(by_seq)} are not 0..n-1"
            )
        out[name] = [by_seq[i] for i in range(len(by_seq))]
    return out


def read_segment(bucket: Bucket, key: str) -> dict:
    try:
        doc = json.loads(bucket.get_bytes(key))
        if doc.get("format") != SEGMENT_FORMAT:
            raise ValueError(f"format is {doc.get('format')!r}, not {SEGMENT_FORMAT!r}")
        doc.setdefault("pieces", [])
        doc.setdefault("prompt_ids", [])
        return doc
    except (ValueError, AttributeError) as exc:
        raise ObjectStoreError(
            f"{bucket.display(key)}: unreadable segment manifest ({exc})"
        ) from None


def _read_all(bucket: Bucket, keys: list[str]) -> list[dict]:
    if not keys:
        return []
    with ThreadPoolExecutor(min(DOWNLOADS_AT_ONCE, len(keys))) as pool:
        return list(pool.map(lambda key: read_segment(bucket, key), keys))


def chain_prompt_ids(bucket: Bucket, keys: list[str]) -> set[str]:
    """The prompt ids the segments ``keys`` commit."""
    return {pid for doc in _read_all(bucket, keys) for pid in doc["prompt_ids"]}


def fence_chain(bucket: Bucket, worker: str, reason: str, since: int = 0) -> tuple[int, set[str]]:
    """Take ``worker``'s next segment number with a fence (see the module docstring); returns
    the fence's number and the prompt ids of the chain's segments numbered ``since`` and up."""
    while True:
        keys = segment_chains(bucket, worker).get(worker, [])
        seq = len(keys)
        doc = {
            "format": SEGMENT_FORMAT,
            "schema_version": 1,
            "worker": worker,
            "seq": seq,
            "fence": reason,
            "pieces": [],
            "prompt_ids": [],
        }
        body = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
        if bucket.put_create(manifest_key(worker, seq), body):
            return seq, chain_prompt_ids(bucket, keys[since:])
        # the writer being fenced took this number first: fence after it


class _At:
    """A file-like writer of one piece into its place in a file (``Bucket.download`` writes,
    and on a retry seeks back to the piece's start)."""

    def __init__(self, fd: int, offset: int) -> None:
        self.fd, self.offset, self.pos = fd, offset, 0

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int) -> None:
        self.pos = pos

    def truncate(self) -> None:
        pass  # a retry writes the same range again

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(self.fd, view, self.offset + self.pos)
            self.pos += n
            view = view[n:]


def _plan(bucket: Bucket, docs: list[dict]) -> dict[str, list[dict]]:
    """Each file's pieces in order (a whole piece replaces what came before); checked
    contiguous."""
    files: dict[str, list[dict]] = {}
    for doc in docs:
        for piece in doc["pieces"]:
            rel = piece["path"]
            if rel.startswith("/") or ".." in rel.split("/") or rel in _KEEP:
                raise ObjectStoreError(f"{bucket.display(piece['key'])}: path {rel!r} is refused")
            chain = files.setdefault(rel, [])
            if piece.get("whole"):
                chain[:] = [piece]
                continue
            have = chain[-1]["end"] if chain else 0
            if piece["start"] != have:
                raise ObjectStoreError(
                    f"{bucket.display(piece['key'])}: starts at {piece['start']}, the file has {have}"
                )
            chain.append(piece)
    return files


def _kept_end(path: Path, pieces: list[dict]) -> int:
    """How far ``path`` already holds the pieces' bytes (checked piece by piece)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    import google_crc32c

    kept = 0
    with open(path, "rb") as f:
        for piece in pieces:
            if piece["end"] > size:
                break
            f.seek(piece["start"])
            crc, left = 0, piece["end"] - piece["start"]
            while left:
                data = f.read(min(left, _CHUNK))
                crc, left = google_crc32c.extend(crc, data), left - len(data)
            if crc32c_hex(crc) != piece["crc32c"]:
                break
            kept = piece["end"]
    return kept


def _download(bucket: Bucket, path: Path, piece: dict) -> int:
    fd = os.open(path, os.O_WRONLY)
    try:
        size, crc = bucket.download(piece["key"], _At(fd, piece["start"]))
    finally:
        os.close(fd)
    if size != piece["end"] - piece["start"] or crc32c_hex(crc) != piece["crc32c"]:
        raise ObjectStoreError(
            f"{bucket.display(piece['key'])}: read {size} bytes with CRC-32C "
            f"{crc32c_hex(crc)}, the segment says {piece['end'] - piece['start']}, "
            f"{piece['crc32c']}"
        )
    return size


def _remove_others(wdir: Path, keep: set[str]) -> None:
    for dirpath, _dirs, names in os.walk(wdir, topdown=False):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), wdir).replace(os.sep, "/")
            if rel not in keep and rel not in _KEEP:
                os.unlink(os.path.join(dirpath, name))
        if dirpath != str(wdir) and not os.listdir(dirpath):
            os.rmdir(dirpath)


def _restore_worker(bucket: Bucket, wdir: Path, keys: list[str]) -> tuple[WorkerState, int, int]:
    """One worker directory from its chain; its state, and the pieces and bytes downloaded."""
    files = _plan(bucket, _read_all(bucket, keys))
    wdir.mkdir(parents=True, exist_ok=True)
    _remove_others(wdir, set(files))
    todo: list[tuple[Path, dict]] = []
    for rel, pieces in files.items():
        path = wdir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = _kept_end(path, pieces)
        with open(path, "ab") as f:
            f.truncate(kept)
        todo += [(path, p) for p in pieces if p["end"] > kept]
    got = 0
    if todo:
        with ThreadPoolExecutor(min(DOWNLOADS_AT_ONCE, len(todo))) as pool:
            got = sum(pool.map(lambda job: _download(bucket, *job), todo))
    for rel in files:
        fd = os.open(wdir / rel, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    st, _, _, _ = advance(wdir, WorkerState(wdir.name))
    sizes = {rel: p[-1]["end"] for rel, p in files.items() if not p[-1].get("whole")}
    if st.ends != sizes:
        raise ObjectStoreError(
            f"{bucket.display(keys[-1])}: the restored files end at {sizes}, their committed "
            f"ends are {st.ends}"
        )
    st.seq = len(keys)
    return st, len(todo), got


def restore_staging(
    root: Path, bucket: Bucket, *, workers: list[str] | None = None, reset: bool = True
) -> dict[str, WorkerState]:
    """Make ``root``'s worker directories the bucket's committed prefix (module docstring);
    the states a shipper continues from. ``workers``: only these directories (a Ray actor's
    own); else every one, and with ``reset`` the root's checkpoint files are removed and its
    ``run_manifest.json`` is the shipped one (a session's start, not its end)."""
    root.mkdir(parents=True, exist_ok=True)
    chains = segment_chains(bucket, workers[0] if workers and len(workers) == 1 else None)
    if workers is not None:
        chains = {w: keys for w, keys in chains.items() if w in workers}
    else:
        for wdir in root.glob("worker_*"):
            if wdir.is_dir() and wdir.name not in chains:
                shutil.rmtree(wdir)
    if workers is None and reset:
        for name in _RESET_FILES:
            (root / name).unlink(missing_ok=True)
        manifest_key_ = f"{RUN_PREFIX}/{layout.MANIFEST}"
        if bucket.head(manifest_key_) is not None:
            (root / layout.MANIFEST).write_bytes(bucket.get_bytes(manifest_key_))
    for name in workers or ():
        if name not in chains and (root / name).is_dir():
            shutil.rmtree(root / name)
    states: dict[str, WorkerState] = {}
    pieces = got = 0
    for worker, keys in sorted(chains.items()):
        states[worker], n, size = _restore_worker(bucket, root / worker, keys)
        pieces, got = pieces + n, got + size
    if states:
        log.info(
            "%s: restored %d worker dir(s) from %d segment(s); %d piece(s), %d bytes "
            "downloaded, the rest already on disk",
            bucket.url,
            len(states),
            sum(s.seq for s in states.values()),
            pieces,
            got,
        )
    return states

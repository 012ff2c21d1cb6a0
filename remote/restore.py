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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hallulog.contracts import layout
from hallulog.remote.client import Bucket, ObjectStoreError, crc32c_hex
from hallulog.remote.epochs import EpochRule, write_epoch
from hallulog.remote.segments import (
    ROOT_CHAIN,
    ROOT_FILES,
    RUN_PREFIX,
    SEGMENT_FORMAT,
    SEGMENTS,
    WorkerState,
    advance,
    chain_dir,
    manifest_key,
    manifest_seq,
    segment_doc,
)

__all__ = [
    "segment_chains",
    "read_segment",
    "read_chain",
    "fence_chain",
    "fence_session",
    "chain_prompt_ids",
    "restore_staging",
    "plan_files",
]

log = logging.getLogger(__name__)

DOWNLOADS_AT_ONCE = 16
_CHUNK = 8 << 20
_RESET_FILES = (layout.CHECKPOINT, layout.COMPLETION_LOG)
_KEEP = (layout.WRITER_LOCK,)
"""Files of a worker directory that are not its data (left in place by a restore)."""


def _no_guard() -> None:
    pass


def segment_chains(bucket: Bucket, worker: str | None = None) -> dict[str, dict[int, str]]:
    """``chain name -> {seq: manifest key}`` of every manifest listed (one chain's with
    ``worker``); :func:`read_chain` reads one from its latest checkpoint."""
    found: dict[str, dict[int, str]] = {}
    prefix = f"{SEGMENTS}/{worker}/" if worker else f"{SEGMENTS}/"
    for key in bucket.list(prefix):
        named = manifest_seq(key)
        if named is not None:
            found.setdefault(named[0], {})[named[1]] = key
    return found


def read_segment(bucket: Bucket, key: str) -> dict:
    try:
        doc = json.loads(bucket.get_bytes(key))
        if doc.get("format") != SEGMENT_FORMAT:
            raise ValueError(f"format is {doc.get('format')!r}, not {SEGMENT_FORMAT!r}")
        doc.setdefault("pieces", [])
        doc.setdefault("prompt_ids", [])
        doc["key"] = key
        return doc
    except (ValueError, AttributeError) as exc:
        raise ObjectStoreError(
            f"{bucket.display(key)}: unreadable segment manifest ({exc})"
        ) from None


def read_chain(
    bucket: Bucket,
    name: str,
    by_seq: dict[int, str],
    rule: EpochRule,
    cache: dict[str, dict] | None = None,
) -> tuple[list[dict], int]:
    """The chain's manifests from its latest checkpoint on, stale ones (``remote/epochs.py``)
    left out, in order; and its next number. Read from the newest down to that checkpoint (the
    older manifests are superseded); the numbers from there on must be contiguous.
    ``cache``: manifests already read (key -> doc), filled in."""
    cache = {} if cache is None else cache
    if not by_seq:
        return [], 0
    top = max(by_seq)
    docs: list[dict] = []
    seq = top
    while seq >= 0:
        key = by_seq.get(seq)
        if key is None:
            raise ObjectStoreError(
                f"{bucket.display(f'{SEGMENTS}/{name}')}: segment {seq} is missing "
                f"(numbers {min(by_seq)}..{top} listed, no checkpoint after the gap)"
            )
        doc = cache.get(key)
        if doc is None:
            doc = cache[key] = read_segment(bucket, key)
        why = rule.stale(name, seq, doc.get("epoch"))
        if why is not None:
            log.warning("%s: skipped, a stale writer's (%s)", bucket.display(key), why)
        else:
            docs.append(doc)
            if doc.get("checkpoint"):
                break
        seq -= 1
    docs.reverse()
    return docs, top + 1


def chain_prompt_ids(docs: list[dict]) -> set[str]:
    """The prompt ids the manifests ``docs`` commit (a checkpoint's: every one before it)."""
    return {pid for doc in docs for pid in doc["prompt_ids"]}


def fence_chain(
    bucket: Bucket, worker: str, reason: str, epoch: int, guard: Callable[[], None] = _no_guard
) -> int:
    """Take ``worker``'s next segment number with a fence of ``epoch`` (module docstring);
    its number. ``guard`` is called right before the PUT (it raises once the lease is lost)."""
    while True:
        listed = segment_chains(bucket, worker).get(worker, {})
        seq = max(listed, default=-1) + 1
        doc = segment_doc(worker, seq, epoch, fence=reason)
        body = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
        guard()
        if bucket.put_create(manifest_key(worker, seq), body):
            return seq
        # the writer being fenced took this number first: fence after it


def fence_session(
    bucket: Bucket,
    epoch: int,
    command: str,
    chains: list[str] = (),
    guard: Callable[[], None] = _no_guard,
) -> dict[str, int]:
    """A session's start (``remote/epochs.py``): fence every chain in the bucket, the root's
    and ``chains``, then record ``epoch`` with those numbers; ``chain -> fence number``.
    ``guard`` (the lease's ``check``) is called before each of these writes: a holder stopped
    past its lease in the middle of its start writes nothing more once it resumes."""
    names = set(segment_chains(bucket)) | set(chains) | {ROOT_CHAIN}
    fences = {
        name: fence_chain(bucket, name, f"{command}, epoch {epoch}", epoch, guard)
        for name in sorted(names)
    }
    write_epoch(bucket, epoch, command, fences, guard)
    return fences


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


def plan_files(bucket: Bucket, docs: list[dict]) -> dict[str, list[dict]]:
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
    """One piece into its place; a piece inside a pack is a ranged read of the pack."""
    length = piece["end"] - piece["start"]
    span = None
    if piece.get("offset") is not None:
        span = (int(piece["offset"]), int(piece["offset"]) + length)
    fd = os.open(path, os.O_WRONLY)
    try:
        size, crc = bucket.download(piece["key"], _At(fd, piece["start"]), span=span)
    finally:
        os.close(fd)
    if size != length or crc32c_hex(crc) != piece["crc32c"]:
        raise ObjectStoreError(
            f"{bucket.display(piece['key'])}: read {size} bytes with CRC-32C "
            f"{crc32c_hex(crc)}, the segment says {length}, {piece['crc32c']}"
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


def _restore_chain(
    bucket: Bucket, root: Path, name: str, docs: list[dict], next_seq: int
) -> tuple[WorkerState, int, int]:
    """One chain's directory from its manifests; its state, and the pieces and bytes
    downloaded."""
    wdir = chain_dir(root, name)
    files = plan_files(bucket, docs)
    if not files and name != ROOT_CHAIN:  # fences only, or stale segments only: no directory
        shutil.rmtree(wdir, ignore_errors=True)
        st = WorkerState(name, seq=next_seq, chain=docs)
        return st, 0, 0
    wdir.mkdir(parents=True, exist_ok=True)
    if name != ROOT_CHAIN:  # the root holds more than its chain's files
        _remove_others(wdir, set(files))
    else:
        for rel in ROOT_FILES:
            if rel not in files:
                (wdir / rel).unlink(missing_ok=True)
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
    st, _, _, _ = advance(wdir, WorkerState(name))
    sizes = {rel: p[-1]["end"] for rel, p in files.items() if not p[-1].get("whole")}
    if st.ends != sizes:
        raise ObjectStoreError(
            f"{bucket.display(f'{SEGMENTS}/{name}')}: the restored files end at {sizes}, their "
            f"committed ends are {st.ends}"
        )
    st.seq, st.chain = next_seq, docs
    return st, len(todo), got


def restore_staging(
    root: Path, bucket: Bucket, *, workers: list[str] | None = None, reset: bool = True
) -> dict[str, WorkerState]:
    """Make ``root``'s worker directories (and its ``labels.jsonl``) the bucket's committed
    prefix (module docstring); the states a shipper continues from, by chain. ``workers``: only
    these directories (a Ray actor's own); else every one, and with ``reset`` the root's
    checkpoint files are removed and its ``run_manifest.json`` is the shipped one (a session's
    start, not its end)."""
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
        if ROOT_CHAIN not in chains:
            for name in ROOT_FILES:
                (root / name).unlink(missing_ok=True)
        manifest_key_ = f"{RUN_PREFIX}/{layout.MANIFEST}"
        if bucket.head(manifest_key_) is not None:
            (root / layout.MANIFEST).write_bytes(bucket.get_bytes(manifest_key_))
    for name in workers or ():
        if name not in chains and (root / name).is_dir():
            shutil.rmtree(root / name)
    rule = EpochRule.read(bucket)
    read = {name: read_chain(bucket, name, by_seq, rule) for name, by_seq in chains.items()}
    states: dict[str, WorkerState] = {}
    pieces = got = 0
    for name, (docs, next_seq) in sorted(read.items()):
        states[name], n, size = _restore_chain(bucket, root, name, docs, next_seq)
        pieces, got = pieces + n, got + size
    if states:
        log.info(
            "%s: restored %d chain(s) from %d segment(s); %d piece(s), %d bytes downloaded, "
            "the rest already on disk",
            bucket.url,
            len(states),
            sum(len(s.chain) for s in states.values()),
            pieces,
            got,
        )
    return states

"""Compaction of a segment chain: a checkpoint that restates it, and the objects it supersedes.

A chain gains a manifest and a few pieces per shipped segment (every ``--checkpoint-interval``
seconds per worker), so a long run would hold an unbounded number of small objects, and a
restore would read every manifest. Its writer therefore compacts it (``remote/shipper.py``: every
:data:`COMPACT_EVERY` segments, and when it stops):

1. **Plan.** The chain's manifests from its latest checkpoint on (``WorkerState.chain``) give
   every file's pieces from its start (``remote/restore.py`` ``plan_files``).
2. **Pack.** A piece whose object holds :data:`PACK_BYTES` or more (a large range of a shard, a
   full pack) stays where it is. The others are read (from the local file, checked against their
   CRC-32C; else from the bucket) and written, in order, into *packs* of up to
   :data:`PACK_BYTES`, create-only, under the checkpoint's own folder; each piece then names its
   pack and its ``offset`` there.
3. **Commit.** The checkpoint manifest (``"checkpoint": true``: the pieces, each file's end, the
   prompt ids and line counts of the whole chain, and ``supersedes``) is written at the chain's
   next number, create-only, after the writer's guard: the commit point. A fenced writer meets
   412 there and compacts nothing.
4. **Delete** what it supersedes: every manifest numbered below it, and the small pieces and
   packs it re-packed (the previous checkpoint's ``supersedes`` again: a kill during the
   deletes leaves them to the next compaction). A piece that stays in place is never deleted
   while the run lives; small ones are re-packed by every checkpoint that covers them, so no
   writer, however late, deletes an object a newer checkpoint references.

A kill at any step loses nothing: before the commit the chain is as it was (the packs written
are unreferenced), after it the checkpoint restates everything it covers. Once a run's finished
root is pushed, its segments are removed altogether (``drop_segments``): the root holds every
byte.

Bound: a chain holds at most ``2 x bytes / PACK_BYTES + 2`` objects after a compaction (pieces
and packs of ``PACK_BYTES`` or more, one partial pack, the checkpoint), plus what the segments
shipped since add (``COMPACT_EVERY`` manifests and their pieces). Each small byte is uploaded
at most twice, plus at most ``PACK_BYTES`` per checkpoint for the partial pack.
docs/object-storage.md.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hallulog.remote.client import (
    CHECKSUM_ATTRIBUTE,
    Bucket,
    ObjectExistsError,
    ObjectStoreError,
    crc32c_hex,
)
from hallulog.remote.restore import chain_prompt_ids, plan_files
from hallulog.remote.segments import (
    RUN_PREFIX,
    SEGMENTS,
    WorkerState,
    chain_dir,
    manifest_key,
    manifest_seq,
    pack_key,
    read_range,
    segment_doc,
)

__all__ = ["COMPACT_EVERY", "PACK_BYTES", "compact", "drop_segments"]

log = logging.getLogger(__name__)

COMPACT_EVERY = int(os.environ.get("HALLULOG_COMPACT_SEGMENTS", "32"))
"""Segments a chain takes after its checkpoint before its writer compacts it."""
PACK_BYTES = int(os.environ.get("HALLULOG_PACK_BYTES", str(32 << 20)))
"""A pack's size; a piece whose object holds at least this stays where it is."""
DELETES_AT_ONCE = 8


def _object_size(piece: dict) -> int:
    return int(piece.get("object_size") or (piece["end"] - piece["start"]))


def _stays(piece: dict) -> bool:
    return _object_size(piece) >= PACK_BYTES


def _crc(data: bytes) -> str:
    import google_crc32c

    return crc32c_hex(google_crc32c.value(data))


def _piece_bytes(bucket: Bucket, wdir: Path, piece: dict) -> bytes:
    """A piece's bytes: from the local file when it still holds them, else from the bucket."""
    length = piece["end"] - piece["start"]
    data = read_range(wdir / piece["path"], piece["start"], piece["end"])
    if len(data) == length and _crc(data) == piece["crc32c"]:
        return data
    offset = int(piece.get("offset") or 0)
    data = bytes(bucket.get_ranges(piece["key"], [offset], [length])[0])
    if len(data) != length or _crc(data) != piece["crc32c"]:
        raise ObjectStoreError(
            f"{bucket.display(piece['key'])}: {len(data)} bytes with CRC-32C {_crc(data)}, "
            f"the segment says {length}, {piece['crc32c']}"
        )
    return data


class _Packer:
    """Small pieces into packs of up to ``PACK_BYTES``, each written create-only."""

    def __init__(self, bucket: Bucket, name: str, seq: int, nonce: str) -> None:
        self.bucket, self.name, self.seq, self.nonce = bucket, name, seq, nonce
        self.buf = bytearray()
        self.members: list[dict] = []
        self.count = 0

    def add(self, piece: dict, data: bytes) -> dict:
        out = {k: v for k, v in piece.items() if k not in ("offset", "object_size")}
        out["offset"] = len(self.buf)
        self.buf += data
        self.members.append(out)
        if len(self.buf) >= PACK_BYTES:
            self.flush()
        return out

    def flush(self) -> None:
        if not self.members:
            return
        key = pack_key(self.name, self.seq, self.nonce, self.count)
        data = bytes(self.buf)
        crc = _crc(data)
        if not self.bucket.put_create(key, data, {CHECKSUM_ATTRIBUTE: crc}):
            got = self.bucket.get_bytes(key)  # a retried PUT whose first try landed
            if got != data:
                raise ObjectExistsError(f"{self.bucket.display(key)} exists with other bytes")
        for piece in self.members:
            piece["key"], piece["object_size"] = key, len(data)
        self.count += 1
        self.buf, self.members = bytearray(), []


def _delete_all(bucket: Bucket, keys: set[str]) -> None:
    if not keys:
        return
    with ThreadPoolExecutor(min(DELETES_AT_ONCE, len(keys))) as pool:
        list(pool.map(bucket.delete, sorted(keys)))


def compact(
    bucket: Bucket,
    root: Path,
    st: WorkerState,
    *,
    epoch: int,
    nonce: str,
    guard: Callable[[], None] = lambda: None,
) -> WorkerState:
    """Write a checkpoint of the chain ``st`` at its next number and delete what it supersedes
    (module docstring); the chain's state after it. Raises :class:`ObjectExistsError` when the
    number is taken (the chain was fenced): nothing is deleted then."""
    wdir = chain_dir(root, st.name)
    docs = st.chain
    seq = st.seq
    files = plan_files(bucket, docs)
    packer = _Packer(bucket, st.name, seq, nonce)
    pieces: list[dict] = []
    for rel in sorted(files):
        for piece in files[rel]:
            if _stays(piece):
                pieces.append(piece)
            else:
                pieces.append(packer.add(piece, _piece_bytes(bucket, wdir, piece)))
    packer.flush()
    kept = {p["key"] for p in pieces}
    old = {p["key"] for doc in docs for p in doc["pieces"] if not _stays(p)} - kept
    for doc in docs:
        old |= set(doc.get("supersedes", ()))  # the previous checkpoint's, if a kill cut it short
    listed = bucket.list(f"{SEGMENTS}/{st.name}/")
    old |= {k for k in listed if (m := manifest_seq(k)) is not None and m[1] < seq}
    doc = segment_doc(
        st.name,
        seq,
        epoch,
        checkpoint=True,
        ends=dict(sorted(st.ends.items())),
        pieces=pieces,
        prompt_ids=sorted(chain_prompt_ids(docs)),
        lines=dict(sorted(st.lines.items())),
        supersedes=sorted(old - kept),
    )
    body = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
    guard()  # the checkpoint's commit point
    if not bucket.put_create(manifest_key(st.name, seq), body) and (
        bucket.get_bytes(manifest_key(st.name, seq)) != body
    ):
        raise ObjectExistsError(
            f"{bucket.display(manifest_key(st.name, seq))} was written by another writer of "
            f"{st.name}: not compacted (a fence of a newer session)"
        )
    _delete_all(bucket, set(doc["supersedes"]))
    log.info(
        "%s: checkpoint %d of %s: %d piece(s) in %d pack(s), %d object(s) removed",
        bucket.url,
        seq,
        st.name,
        len(pieces),
        packer.count,
        len(doc["supersedes"]),
    )
    doc["key"] = manifest_key(st.name, seq)
    new = st.copy()
    new.seq, new.chain = seq + 1, [doc]
    return new


def drop_segments(bucket: Bucket) -> int:
    """Remove a run's segments, epochs and session objects once its finished root is in the
    bucket (the root holds every byte of them; nothing reads them then); how many objects.
    The run's lease and first manifest stay."""
    keys = {
        key
        for key in bucket.list(f"{RUN_PREFIX}/")
        if key.startswith((f"{SEGMENTS}/", f"{RUN_PREFIX}/epochs/", f"{RUN_PREFIX}/sessions/"))
    }
    _delete_all(bucket, keys)
    return len(keys)

"""Ship a staging root's committed work to a bucket as segments (``remote/segments.py``).

``SegmentShipper(root, bucket, states, interval, epoch=E)`` ships every ``worker_*`` directory
under ``root`` and the root's ``labels.jsonl`` (or the chains named by ``chains``): per pass,
each one's newly committed byte ranges (and whole files) as create-only objects, uploaded a few
at once from a read-only memory map of the file, then the segment's manifest (carrying the
session's lease epoch, ``remote/epochs.py``), the commit point. ``start()`` runs a pass every
``interval`` seconds on a thread, ``stop()`` ends it after one last pass. A chain is compacted
every ``COMPACT_EVERY`` segments and when the shipper stops (``remote/compact.py``). The run on
one node ships from the driver (``cli/bucket_run.py``), a Ray actor from its node
(``remote/actor_shipping.py``).

Exactly once: every object is create-only; a retried PUT whose first try landed meets 412 and is
compared (same size and CRC-32C: kept; other bytes: :class:`ObjectExistsError`, as when another
writer took the segment number — a fence, or another run on the prefix). ``guard``, when given,
is called before each pass, each piece and each segment manifest: it raises when this writer no
longer holds the prefix (``remote/lease.py``), and nothing more is shipped.
"""

from __future__ import annotations

import json
import logging
import mmap
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from hallulog.contracts import layout
from hallulog.remote import compact as compaction
from hallulog.remote.client import (
    CHECKSUM_ATTRIBUTE,
    Bucket,
    ObjectExistsError,
    ObjectStoreError,
    crc32c_hex,
)
from hallulog.remote.segments import (
    ROOT_CHAIN,
    RUN_PREFIX,
    WorkerState,
    advance,
    chain_dir,
    manifest_key,
    piece_key,
    segment_doc,
)

__all__ = ["SegmentShipper", "crc_of"]

log = logging.getLogger(__name__)

UPLOADS_AT_ONCE = 8
_CRC_CHUNK = 8 << 20


def crc_of(data) -> str:
    """CRC-32C (8 hex digits) of a bytes-like object, read in chunks (no whole copy)."""
    import google_crc32c

    view = memoryview(data)
    crc = 0
    for i in range(0, len(view), _CRC_CHUNK):
        crc = google_crc32c.extend(crc, bytes(view[i : i + _CRC_CHUNK]))
    return crc32c_hex(crc)


@contextmanager
def _mapped(path: Path, start: int, end: int | None):
    """A read-only view of ``path``'s bytes ``[start, end)`` (to its end when None); raises
    when the file holds fewer."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        stop = size if end is None else end
        if size < stop:
            raise ObjectStoreError(f"{path}: holds {size} bytes, {stop} are committed")
        if stop == start:
            yield memoryview(b"")
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            view = memoryview(m)[start:stop]
            try:
                yield view
            finally:
                view.release()


class SegmentShipper:
    """Ships the committed work of ``root``'s worker directories as segments."""

    def __init__(
        self,
        root: Path,
        bucket: Bucket,
        states: dict[str, WorkerState],
        interval: float,
        guard: Callable[[], None] | None = None,
        *,
        epoch: int = 0,
        chains: list[str] | None = None,
    ) -> None:
        self.root, self.bucket, self.states, self.interval = Path(root), bucket, states, interval
        self.guard = guard or (lambda: None)
        self.epoch = epoch
        self.chains = chains
        """The chains shipped (None: every ``worker_*`` directory and the root's)."""
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
            except Exception as exc:  # the guard's refusal: nothing more is shipped
                self.error = exc
                log.error("stopped shipping segments to %s: %s", self.bucket.url, exc)
                return

    def stop(self) -> None:
        """Stop the thread, ship what is committed now and compact every chain that took
        segments since its checkpoint (raises what that last pass raised)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.ship(compact_from=2)

    def _names(self) -> list[str]:
        if self.chains is not None:
            return list(self.chains)
        workers = [w.name for w in sorted(self.root.glob("worker_*")) if w.is_dir()]
        return [*workers, ROOT_CHAIN]

    def ship(self, compact_from: int | None = None) -> int:
        """One pass: a segment for each chain with newly committed bytes; a chain that has
        taken ``compact_from`` (``COMPACT_EVERY``) segments since its checkpoint is compacted."""
        limit = compaction.COMPACT_EVERY if compact_from is None else compact_from
        with self._lock:
            self.guard()
            self._ship_manifest()
            written = 0
            for name in self._names():
                wdir = chain_dir(self.root, name)
                st = self.states.setdefault(name, WorkerState(name))
                new, grown, whole, prompt_ids = advance(wdir, st)
                if grown or whole:
                    doc = self._ship_segment(wdir, st, new, grown, whole, prompt_ids)
                    new.seq = st.seq + 1
                    new.chain.append(doc)
                    self.states[name] = st = new
                    written += 1
                if st.since_checkpoint >= limit:
                    self.states[name] = compaction.compact(
                        self.bucket,
                        self.root,
                        st,
                        epoch=self.epoch,
                        nonce=self.nonce,
                        guard=self.guard,
                    )
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
            f"{RUN_PREFIX}/{layout.MANIFEST}", data, {CHECKSUM_ATTRIBUTE: crc_of(data)}
        )
        self._manifest_shipped = True

    def _put(self, key: str, data, crc: str) -> None:
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

    def _ship_piece(
        self, wdir: Path, name: str, seq: int, rel: str, start: int, end: int | None
    ) -> dict:
        """Upload one piece (``end`` None: the whole file) and describe it."""
        try:
            with _mapped(wdir / rel, start, end) as view:
                stop = start + len(view)
                crc = crc_of(view)
                key = piece_key(name, seq, self.nonce, rel, start, stop, end is None)
                self.guard()  # a writer stopped past its lease uploads nothing once resumed
                self._put(key, view, crc)
        except FileNotFoundError:
            raise ObjectStoreError(f"{wdir / rel}: committed, but missing") from None
        piece = {"path": rel, "start": start, "end": stop, "key": key, "crc32c": crc}
        if end is None:
            piece["whole"] = True
        return piece

    def _ship_segment(
        self,
        wdir: Path,
        st: WorkerState,
        new: WorkerState,
        grown: dict[str, int],
        whole: set[str],
        prompt_ids: list[str],
    ) -> dict:
        jobs = [(rel, st.ends.get(rel, 0), end) for rel, end in sorted(grown.items())]
        jobs += [(rel, 0, None) for rel in sorted(whole)]
        with ThreadPoolExecutor(min(UPLOADS_AT_ONCE, len(jobs))) as pool:
            pieces = list(pool.map(lambda job: self._ship_piece(wdir, st.name, st.seq, *job), jobs))
        doc = segment_doc(
            st.name,
            st.seq,
            self.epoch,
            ends=dict(sorted(new.ends.items())),
            pieces=pieces,
            prompt_ids=prompt_ids,
            lines=dict(sorted(new.lines.items())),
        )
        body = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
        key = manifest_key(st.name, st.seq)
        self.guard()  # the segment's commit point
        if not self.bucket.put_create(key, body, {CHECKSUM_ATTRIBUTE: crc_of(body)}):
            if self.bucket.get_bytes(key) != body:
                raise ObjectExistsError(
                    f"{self.bucket.display(key)} was written by another writer of "
                    f"{st.name}; refusing to overwrite it (a fence of a newer session, or "
                    "two runs on one prefix)"
                )
        doc["key"] = key
        return doc

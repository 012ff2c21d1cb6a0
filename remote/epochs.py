"""Fencing tokens of a bucket root: lease epochs, and the rule a restore applies with them.

Every acquisition of the prefix's lease (``remote/lease.py``) takes the next *epoch*: one more
than the lease it replaces and than every epoch recorded under ``.hallulog-run/epochs/``. A
session that writes segments (``run``, ``retry``; the Ray driver for its actors) or that takes
them as the truth (``consolidate``) first fences every chain it knows of at its next number
(``remote/restore.py`` ``fence_session``), then records its epoch with those fence numbers,
create-only: ``.hallulog-run/epochs/{epoch:08d}.json`` = ``{"epoch", "command", "fences":
{chain: seq}}``. Every segment manifest its writers ship carries the epoch.

The rule (:class:`EpochRule`), applied wherever segments are restored or counted: a manifest of
epoch ``e`` at number ``s`` of chain ``w`` is **stale** when some recorded epoch ``E > e``
fenced ``w`` at a number ``<= s``, or did not fence ``w`` at all (the chain was begun after
``E`` had started). A stale manifest is skipped, its pieces never restored: whatever a holder
paused past its lease ships after its successor has fenced is never consolidated. Manifests
without an epoch (written before epochs existed) are epoch 0.

Why epochs and not a conditional write on the lease object per segment: segments are shipped by
many writers at once (the Ray actors, each on its node) while one process, the driver, holds the
lease; a per-segment compare-and-swap on that one object would serialise every actor's segment
through it (412s and retries under contention, one lease version per segment in a versioned
bucket), and a writer paused between that swap and its manifest's PUT would still land late.
An epoch costs one field per manifest, one fence per chain and one small object per session; the
check is a read at restore.
docs/object-storage.md.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from hallulog.remote.client import Bucket, ObjectStoreError
from hallulog.remote.segments import RUN_PREFIX

__all__ = [
    "EPOCHS",
    "EPOCH_FORMAT",
    "EpochRule",
    "epoch_key",
    "latest_epoch",
    "read_epochs",
    "write_epoch",
]

log = logging.getLogger(__name__)

EPOCHS = f"{RUN_PREFIX}/epochs"
EPOCH_FORMAT = "hallulog.epoch"


def epoch_key(epoch: int) -> str:
    return f"{EPOCHS}/{epoch:08d}.json"


def _listed(bucket: Bucket) -> dict[int, str]:
    out = {}
    for key in bucket.list(f"{EPOCHS}/"):
        name = key.rsplit("/", 1)[-1]
        if name.endswith(".json") and name[:-5].isdigit():
            out[int(name[:-5])] = key
    return out


def latest_epoch(bucket: Bucket) -> int:
    """The highest epoch recorded under the prefix (0: none)."""
    return max(_listed(bucket), default=0)


def write_epoch(
    bucket: Bucket,
    epoch: int,
    command: str,
    fences: dict[str, int],
    guard: Callable[[], None] | None = None,
) -> None:
    """Record ``epoch``'s fences (create-only: an epoch is recorded once). ``guard`` (the
    lease's ``check``) is called right before the PUT."""
    doc = {"format": EPOCH_FORMAT, "epoch": epoch, "command": command, "fences": fences}
    body = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
    if guard is not None:
        guard()
    if not bucket.put_create(epoch_key(epoch), body) and bucket.get_bytes(epoch_key(epoch)) != body:
        raise ObjectStoreError(
            f"{bucket.display(epoch_key(epoch))} was recorded by another command: two holders "
            "of one lease epoch (a server that ignores If-Match?)"
        )


def _fences(bucket: Bucket, key: str) -> dict[str, int]:
    """One epoch record's fences (a JSON document)."""
    try:
        doc = json.loads(bucket.get_bytes(key))
        return {str(k): int(v) for k, v in doc["fences"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ObjectStoreError(f"{bucket.display(key)}: unreadable epoch record ({exc})") from None


def read_epochs(bucket: Bucket) -> dict[int, dict[str, int]]:
    """``epoch -> {chain: fence number}`` of every recorded epoch."""
    return {epoch: _fences(bucket, key) for epoch, key in sorted(_listed(bucket).items())}


class EpochRule:
    """Which manifests a restore skips (module docstring)."""

    def __init__(self, epochs: dict[int, dict[str, int]]) -> None:
        self.epochs = epochs

    @classmethod
    def read(cls, bucket: Bucket) -> EpochRule:
        return cls(read_epochs(bucket))

    def stale(self, chain: str, seq: int, epoch: int | None) -> str | None:
        """Why manifest ``seq`` of ``chain``, of ``epoch``, is stale (None: it is not)."""
        mine = int(epoch or 0)
        for later, fences in self.epochs.items():
            if later <= mine:
                continue
            fence = fences.get(chain)
            if fence is None:
                return f"epoch {mine} < {later}, which did not know the chain"
            if seq >= fence:
                return f"epoch {mine} < {later}, which fenced the chain at {fence}"
        return None

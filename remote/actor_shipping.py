"""A Ray actor's worker directory on a bucket root: staged on its node, shipped by the actor.

With ``--executor ray`` and an ``s3://`` artifact root the nodes share nothing but the bucket.
Each actor (``workers/ray_actor.py``) writes ``worker_{slot}/`` into a staging directory on its
own node (``$HALLULOG_CACHE_DIR/staging/<bucket>-<hash of the URL>-slot{slot}``; never the
driver's), restored first from the worker's segments (``remote/restore.py``: a
replacement on the same node re-reads its own disk, elsewhere the bucket), and ships it
(``remote/shipper.py``).

A group's ``done`` event is held until the segment holding its commit is in the bucket: the
driver counts a group done only once a lost node can no longer take it along. The actor ships
when every group it holds is finished, else at most ``ship_gap`` seconds after the first held
one finished, one segment at a time (commits that finish during an upload share the next). A
node lost mid-upload loses its unsealed segment (pieces without their manifest are ignored);
the driver then fences the chain and redoes what is not in it. A shipment refused because the
segment number is taken (a fence: the driver gave this slot up) stops the actor's worker.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from hallulog.contracts.errors import HallulogError
from hallulog.remote.client import Bucket, ObjectExistsError, ObjectStoreError
from hallulog.remote.restore import restore_staging
from hallulog.remote.segments import RUN_PREFIX
from hallulog.remote.shipper import SegmentShipper

__all__ = ["ActorShipping", "BucketUnreachable", "session_key", "node_staging", "drop_node_staging"]

log = logging.getLogger(__name__)


class BucketUnreachable(HallulogError, RuntimeError):
    """The actor cannot read the driver's bucket from its node."""


def session_key(session: str) -> str:
    """The object a driver writes for each session; every actor must read it back."""
    return f"{RUN_PREFIX}/sessions/{session}"


def _node_prefix(url: str) -> Path:
    env = os.environ.get("HALLULOG_CACHE_DIR")
    cache = Path(env) if env else Path.home() / ".cache" / "hallulog"
    bucket = url.partition("://")[2].split("/", 1)[0]
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return cache / "staging" / f"{bucket}-{digest}-slot"


def node_staging(url: str, slot: int) -> Path:
    """This node's staging root for ``slot`` (see the module docstring)."""
    prefix = _node_prefix(url)
    return prefix.with_name(f"{prefix.name}{slot}")


def drop_node_staging(url: str) -> list[str]:
    """Remove this node's staging roots of ``url`` (every slot's: a lost actor's too), once
    the driver has stopped every actor: what they held is in the bucket, or was never
    committed there and is redone. The paths removed."""
    prefix = _node_prefix(url)
    gone = []
    for path in sorted(prefix.parent.glob(f"{prefix.name}*")):
        if path.is_dir() and path.name[len(prefix.name) :].isdigit():
            aside = path.with_name(f".{path.name}.removing-{os.getpid()}")
            path.rename(aside)  # one atomic step; then deleted
            shutil.rmtree(aside, ignore_errors=True)
            gone.append(str(path))
    return gone


class ActorShipping:
    """The actor side of a bucket root (module docstring). ``send`` is where the actor's
    events go once released (its outbox)."""

    def __init__(self, remote: dict[str, Any], slot: int, node: str, send) -> None:
        self.bucket = Bucket(remote["url"])
        self.gap = float(remote["ship_gap"])
        self.slot, self.worker = slot, f"worker_{slot}"
        self._send = send
        try:
            seen = self.bucket.get_bytes(session_key(remote["session"])).decode()
        except (ObjectStoreError, FileNotFoundError) as exc:
            seen = f"unreadable: {exc}"
        if seen != remote["session"]:
            raise BucketUnreachable(
                f"{self.bucket.url} is not the driver's bucket from node {node}: its session "
                f"object {session_key(remote['session'])} is {seen!r} (give every node the same "
                "endpoint and credentials: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...)"
            )
        self.root = node_staging(self.bucket.url, slot)
        states = restore_staging(self.root, self.bucket, workers=[self.worker])
        self.shipper = SegmentShipper(
            self.root,
            self.bucket,
            states,
            interval=self.gap,
            epoch=int(remote.get("epoch") or 0),
            chains=[self.worker],
        )
        self._held: list[tuple[float, dict]] = []
        self._given = 0  # groups submitted and not resolved
        self._cond = threading.Condition()
        self._stopping = False
        self.fenced: str | None = None
        self._thread = threading.Thread(target=self._loop, name="actor-shipper", daemon=True)
        self._thread.start()

    @property
    def worker_dir(self) -> Path:
        return self.root / self.worker

    # -- the actor's events ---------------------------------------------------------------
    def given(self, n: int) -> None:
        with self._cond:
            self._given += n

    def event(self, event: dict[str, Any]) -> None:
        """An event of the worker: a ``done`` is held until shipped, the rest go on now."""
        kind = event.get("event")
        with self._cond:
            if kind in ("done", "failed", "requeue"):
                self._given -= 1
            if kind == "done":
                if self.fenced is None:
                    self._held.append((time.monotonic(), event))
                    self._cond.notify()
                return  # fenced: never shipped, so never reported (the driver redoes it)
        self._send(event)

    # -- shipping -------------------------------------------------------------------------
    def _due(self) -> float | None:
        """Seconds until the held groups are shipped (0: now), None when none is held."""
        if not self._held:
            return None
        if self._stopping or len(self._held) >= self._given:
            return 0.0
        return max(0.0, self._held[0][0] + self.gap - time.monotonic())

    def _loop(self) -> None:
        while True:
            with self._cond:
                while (due := self._due()) != 0.0:
                    if self._stopping:
                        return
                    self._cond.wait(timeout=due)
                batch, self._held = self._held, []
            if not self._ship_and_release(batch):
                return

    def _ship_and_release(self, batch: list[tuple[float, dict]]) -> bool:
        """Ship what is committed, then release ``batch``; False when the actor must stop."""
        while True:
            try:
                self.shipper.ship()
                break
            except ObjectExistsError as exc:  # the slot was given up (a fence), or two writers
                self.fenced = str(exc)
                log.error("%s: %s; this actor stops", self.worker, exc)
                self._send(
                    {
                        "event": "fatal",
                        "worker_id": self.slot,
                        "error": {"error_message": f"{self.worker}: {exc}"},
                    }
                )
                return False
            except (ObjectStoreError, OSError) as exc:  # the bucket is away: try again
                log.error("%s: shipping to %s: %s (retrying)", self.worker, self.bucket.url, exc)
                time.sleep(self.gap)
        for _, event in batch:
            self._send(event)
        return True

    def stop(self) -> None:
        """Ship what is committed now and release what is held (the worker has finished)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()
        with self._cond:
            batch, self._held = self._held, []
        if self.fenced is None:
            self._ship_and_release(batch)

"""``--executor ray`` on an ``s3://`` root: the driver's side of the bucket.

The driver writes a session object every actor must read back (the shared-filesystem probe of a
bucket root), puts the run's manifest in the bucket before any actor starts, and answers the
pool's ``committed_in`` for a lost slot from its segment chain once fenced
(``remote/restore.py``): whatever the lost actor still ships cannot count, and each
manifest is read once per session. Every prompt of the chain counts (a checkpoint restates the
ones before it): the lost actor's in-flight groups were never committed before this session.
The actors' side: ``remote/actor_shipping.py``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

__all__ = ["BucketSlots"]

log = logging.getLogger(__name__)


class BucketSlots:
    """The driver's side of a bucket root: the session object every actor reads back, the run
    manifest in the bucket, and each lost slot's committed prompts from its fenced chain (each
    segment read once per session)."""

    def __init__(self, remote: Any, root: Path, session: str) -> None:
        from hallulog.contracts import layout
        from hallulog.remote.actor_shipping import session_key
        from hallulog.remote.client import Bucket
        from hallulog.remote.segments import RUN_PREFIX

        self.bucket = Bucket(remote.url)
        self.bucket.put_create(session_key(session), session.encode())
        manifest = (root / layout.MANIFEST).read_bytes()  # the first session's stays
        self.bucket.put_create(f"{RUN_PREFIX}/{layout.MANIFEST}", manifest)
        self.actor_options = {
            "url": remote.url,
            "ship_gap": remote.ship_gap,
            "session": session,
            "epoch": remote.epoch,
        }
        self._epoch = remote.epoch
        self._read: dict[str, dict] = {}  # manifest key -> doc: each read once per session

    def committed_in(self, wid: int) -> set[str]:
        from hallulog.remote.epochs import EpochRule
        from hallulog.remote.restore import (
            chain_prompt_ids,
            fence_chain,
            read_chain,
            segment_chains,
        )

        worker = f"worker_{wid}"
        seq = fence_chain(self.bucket, worker, f"slot {wid} lost", self._epoch)
        by_seq = segment_chains(self.bucket, worker).get(worker, {})
        docs, _ = read_chain(self.bucket, worker, by_seq, EpochRule.read(self.bucket), self._read)
        ids = chain_prompt_ids(docs)
        log.warning(
            "ray executor: %s fenced at segment %d; %d prompt(s) committed in its chain",
            worker,
            seq,
            len(ids),
        )
        return ids

    def drop_node_staging(self, timeout: float = 30.0) -> None:
        """Every actor stopped: remove the slots' staging roots on every live node (a lost
        actor's node included), one task per node pinned to it."""
        import ray
        from hallulog.remote.actor_shipping import drop_node_staging
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        task = ray.remote(num_cpus=0)(drop_node_staging)
        refs = [
            task.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            ).remote(self.actor_options["url"])
            for node in ray.nodes()
            if node.get("Alive")
        ]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        removed = 0
        for ref in done:
            try:
                removed += len(ray.get(ref))
            except Exception as exc:  # a node that went away meanwhile: its cache stays
                log.warning("ray executor: a node's staging directories not removed: %s", exc)
        log.info("ray executor: %d node staging director(ies) removed", removed)

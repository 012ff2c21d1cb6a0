"""``hallulog status s3://BUCKET/PREFIX`` (or ``--artifact-root s3://…``): a run's status from
its bucket, reading only small objects, never the data.

- A **finished root** (``.hallulog-tree.json``): its ``run_manifest.json`` (run id, config)
  and ``consolidated/validation_report.json`` (the counts); phase ``done``.
- Else the run's **segments**: each chain read from its latest checkpoint
  (``remote/restore.py``, stale writers' segments left out, ``remote/epochs.py``); a manifest
  carries its chain's committed line counts (prompts, generations, errors), so a worker's
  figures are its last manifest's. Phase ``running`` while a live command holds the prefix's
  lease (``remote/lease.py``), else ``stopped``.

The snapshot has the shape of ``hallulog.api.client.status_from_artifacts``'s (``source``
``bucket``), plus ``lease`` (the holder, or None). docs/object-storage.md.
"""

from __future__ import annotations

import json
import time

from hallulog.contracts import layout
from hallulog.remote.client import Bucket

__all__ = ["status_from_bucket", "format_lease"]

_CONFIG_KEYS = (
    "model",
    "dataset",
    "split",
    "k_samples",
    "logging_profile",
    "target_layers",
    "sequence_mode",
    "storage_format",
    "dtype",
    "max_tokens",
    "worker_count",
)


def _json(bucket: Bucket, key: str) -> dict:
    if bucket.head(key) is None:
        return {}
    try:
        doc = json.loads(bucket.get_bytes(key))
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _lease(bucket: Bucket) -> dict | None:
    from hallulog.remote.lease import live_holder

    rec = live_holder(bucket)
    if rec is None:
        return None
    age = time.time() - float(rec.get("heartbeat") or 0)
    return {k: rec.get(k) for k in ("command", "host", "pid", "since", "epoch")} | {
        "heartbeat_age_s": round(age, 1)
    }


def _chains(bucket: Bucket) -> list[dict]:
    """Per worker chain: ``{id, done, generations, errors}`` from its last valid manifest."""
    from hallulog.remote.epochs import EpochRule
    from hallulog.remote.restore import chain_prompt_ids, read_chain, segment_chains
    from hallulog.remote.segments import ROOT_CHAIN

    rule = EpochRule.read(bucket)
    workers = []
    for name, by_seq in sorted(segment_chains(bucket).items()):
        wid = layout.worker_id_of(name)
        if name == ROOT_CHAIN or wid is None:
            continue
        docs, _ = read_chain(bucket, name, by_seq, rule)
        lines = next((d["lines"] for d in reversed(docs) if d.get("lines")), None)
        lines = lines or {layout.PROMPT_INDEX: len(chain_prompt_ids(docs))}
        workers.append(
            {
                "id": wid,
                "state": "shipped",
                "current_prompt": None,
                "in_flight": 0,
                "done": int(lines.get(layout.PROMPT_INDEX, 0)),
                "errors": int(lines.get(layout.ERRORS, 0)),
                "generations": int(lines.get(layout.GENERATIONS, 0)),
                "tokens": None,
                "updated_at": None,
            }
        )
    return sorted(workers, key=lambda w: w["id"])


def status_from_bucket(url: str) -> dict:
    """The status snapshot of the run at ``url`` (module docstring)."""
    from hallulog.api.client import StatusError
    from hallulog.remote.segments import RUN_PREFIX
    from hallulog.remote.sync import read_tree_list

    bucket = Bucket(url)
    finished = read_tree_list(bucket) is not None
    manifest = _json(bucket, layout.MANIFEST if finished else f"{RUN_PREFIX}/{layout.MANIFEST}")
    if not manifest:
        raise StatusError(f"{url} holds no hallulog run (neither a finished root nor segments)")
    workers: list[dict] = []
    errors_total = 0
    if finished:
        report = _json(bucket, f"{layout.CONSOLIDATED}/{layout.VALIDATION_REPORT}")
        counts = report.get("counts") or {}
        done = int(counts.get("prompts") or len(manifest.get("completed_prompt_ids") or []))
        generations = int((report.get("counts") or {}).get("generations") or 0)
        phase = "done"
    else:
        workers = _chains(bucket)
        done = sum(w["done"] for w in workers)
        generations = sum(w["generations"] for w in workers)
        errors_total = sum(w["errors"] for w in workers)
    holder = _lease(bucket)
    if not finished:
        phase = "running" if holder else "stopped"
    total = manifest.get("total_prompts")
    total = int(total) if isinstance(total, int) else done
    return {
        "version": 1,
        "source": "bucket",
        "run_id": manifest.get("run_id"),
        "config": {k: manifest[k] for k in _CONFIG_KEYS if k in manifest},
        "fingerprint": manifest.get("config_fingerprint"),
        "artifact_root": url,
        "k_samples": manifest.get("k_samples"),
        "phase": phase,
        "started_at": manifest.get("timestamp"),
        "updated_at": None,
        "now": time.time(),
        "elapsed_s": None,
        "prompts": {
            "total": total,
            "done": done,
            "failed": 0,
            "in_flight": 0,
            "skipped": 0,
            "remaining": max(0, total - done),
        },
        "progress": done / total if total else 1.0,
        "generations": generations,
        "tokens": None,
        "errors_total": errors_total,
        "rates": None,
        "eta_s": None,
        "workers": workers,
        "servers": [],
        "errors": [],
        "history": None,
        "evaluation_report": None,
        "lease": holder,
    }


def format_lease(snapshot: dict) -> str:
    """One line: who holds the prefix now."""
    holder = snapshot.get("lease")
    if not holder:
        return f"bucket: {snapshot['artifact_root']} is held by no live command"
    return (
        f"bucket: {snapshot['artifact_root']} is held by {holder['command']} (pid "
        f"{holder['pid']} on {holder['host']}, since {holder['since']}), heartbeat "
        f"{holder['heartbeat_age_s']:.0f} s ago"
    )

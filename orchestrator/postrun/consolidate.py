"""Consolidation (seed 003 §11.2): merge every worker's output into ``consolidated/``.

- JSONL rows are streamed worker by worker; only complete prompt groups (a prompt row and K+1
  generations) are kept, each prompt once (the latest commit wins when a prompt was committed
  twice, e.g. by ``--retry-failed``) and each (prompt_id, sample_id) once.
- Per-file activations (npy) are hard-linked into ``consolidated/activations/`` (copied only
  across filesystems); shard formats get a manifest over the worker stores (no copy), or a
  physical merge with ``merge=True``.
- Labels from ``labels.jsonl`` (the judge, after the run) are joined into the prompt rows.
- ``run_manifest.json`` gets a ``consolidation`` block.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import storage
from contracts import layout
from contracts.jsonl import iter_rows
from orchestrator.errors import ArtifactError
from orchestrator.postrun.labels import apply_label, load_labels
from orchestrator.manifest import load_manifest, update_manifest

__all__ = ["consolidate", "ConsolidationResult"]

log = logging.getLogger(__name__)

class ConsolidationResult(dict):
    """The consolidation block written into run_manifest.json."""


def _pick_commits(root: Path, k_samples: int) -> dict[str, tuple[str, str | None]]:
    """prompt_id → (worker dir name, commit_id) of the commit to keep (complete, latest)."""
    counts: dict[tuple[str, str, str | None], set[int]] = defaultdict(set)
    for wdir in layout.worker_dirs(root):
        for row in iter_rows(wdir / layout.GENERATIONS, malformed="skip"):
            counts[(wdir.name, row.get("prompt_id"), row.get("commit_id"))].add(
                row.get("sample_id"))
    chosen: dict[str, tuple[str, str | None, str]] = {}
    for wdir in layout.worker_dirs(root):
        for row in iter_rows(wdir / layout.PROMPT_INDEX, malformed="skip"):
            pid, cid = row.get("prompt_id"), row.get("commit_id")
            samples = counts.get((wdir.name, pid, cid), set())
            if samples != set(range(k_samples + 1)):
                continue
            stamp = row.get("completed_at") or ""
            if pid not in chosen or stamp >= chosen[pid][2]:
                chosen[pid] = (wdir.name, cid, stamp)
    return {pid: (w, c) for pid, (w, c, _) in chosen.items()}


def _link_or_copy(src: Path, dst: Path) -> str:
    if dst.exists():
        if os.path.samefile(src, dst):
            return "link"
        dst.unlink()
    try:
        os.link(src, dst)
        return "link"
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
        shutil.copy2(src, dst)
        return "copy"


def consolidate(root: Path, *, merge: bool = False) -> ConsolidationResult:
    """Merge ``worker_*`` into ``root/consolidated``; returns the consolidation metadata."""
    started = time.monotonic()
    root = Path(root)
    manifest = load_manifest(root)
    if manifest is None:
        raise ArtifactError(f"{root}/run_manifest.json: no run here to consolidate")
    k = int(manifest["k_samples"])
    fmt = manifest.get("storage_format", "npy")
    out = layout.consolidated_dir(root)
    out.mkdir(exist_ok=True)
    chosen = _pick_commits(root, k)
    labels = load_labels(root)
    kept_generations = kept_activations = total_bytes = 0
    modes: dict[str, int] = defaultdict(int)
    act_dir = out / "activations"

    tmp = {name: open(out / f"{name}.partial", "w", encoding="utf-8")
           for name in (layout.PROMPT_INDEX, layout.GENERATIONS, layout.ACTIVATION_INDEX)}
    try:
        if fmt == "npy":
            act_dir.mkdir(exist_ok=True)
        for wdir in layout.worker_dirs(root):
            def keep(row: dict[str, Any]) -> bool:
                pick = chosen.get(row.get("prompt_id"))
                return pick is not None and pick == (wdir.name, row.get("commit_id"))

            sample_labels: dict[tuple[str, int], Any] = {}
            for row in iter_rows(wdir / layout.PROMPT_INDEX):
                if keep(row):
                    row = apply_label(row, labels.get(row["prompt_id"]))
                    sample_labels[(row["prompt_id"], 0)] = row.get("label")
                    tmp[layout.PROMPT_INDEX].write(json.dumps(row, ensure_ascii=False) + "\n")
            seen: set[tuple[str, int]] = set()
            for row in iter_rows(wdir / layout.GENERATIONS):
                key = (row["prompt_id"], row["sample_id"])
                if keep(row) and key not in seen:
                    seen.add(key)
                    sample_labels.setdefault(key, row.get("label"))
                    kept_generations += 1
                    tmp[layout.GENERATIONS].write(json.dumps(row, ensure_ascii=False) + "\n")
            for row in iter_rows(wdir / layout.ACTIVATION_INDEX):
                if not keep(row):
                    continue
                if fmt == "npy":
                    src = wdir / row["file_path"]
                    modes[_link_or_copy(src, act_dir / src.name)] += 1
                    row = {**row, "file_path": f"activations/{src.name}",
                           "source_path": f"{wdir.name}/{row['file_path']}"}
                # readers of the store take each sample's label from here
                label = sample_labels.get((row["prompt_id"], row["sample_id"]))
                row = {**row, "label": -1 if label is None else int(label)}
                total_bytes += int(row.get("size_bytes") or 0)
                kept_activations += 1
                tmp[layout.ACTIVATION_INDEX].write(json.dumps(row, ensure_ascii=False) + "\n")
        for f in tmp.values():
            f.flush()
            os.fsync(f.fileno())
    finally:
        for f in tmp.values():
            f.close()
    for name in tmp:
        os.replace(out / f"{name}.partial", out / name)

    if fmt != "npy":
        stores = [storage.store_dir(w) for w in layout.worker_dirs(root)
                  if os.path.exists(storage.store_dir(w))]
        if stores:
            if merge:
                if act_dir.exists():
                    shutil.rmtree(act_dir)
                storage.merge_stores(stores, act_dir, fmt=fmt)
                modes["merge"] = len(stores)
            else:
                storage.write_multi_manifest(act_dir, stores)
                modes["manifest"] = len(stores)

    result = ConsolidationResult(
        timestamp=time.strftime("%Y-%m-%dT%H:%M:%S%z"), prompts=len(chosen),
        generations=kept_generations, activations=kept_activations, total_bytes=total_bytes,
        activation_modes=dict(modes), seconds=round(time.monotonic() - started, 3),
        path=layout.CONSOLIDATED)
    update_manifest(root, consolidation=dict(result))
    log.info("consolidated %d prompts, %d generations, %d activations in %.2f s",
             len(chosen), kept_generations, kept_activations, result["seconds"])
    return result

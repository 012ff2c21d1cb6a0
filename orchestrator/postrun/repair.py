"""What ``--retry-failed`` reprocesses, and the quarantine of malformed worker lines.

A prompt is retried when it has no complete commit in any worker directory: a prompt row, K+1
generations and K+1 activations whose files exist (per-file formats). That covers the prompts
in ``errors.jsonl`` (failed generation, failed capture), the prompts of the task never done,
lines lost to corruption and activation files deleted after the fact.
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from pathlib import Path

from contracts import layout
from contracts.jsonl import iter_rows
from orchestrator.manifest import load_manifest

__all__ = ["prompts_to_retry", "quarantine_malformed_lines"]

log = logging.getLogger(__name__)

_WORKER_FILES = (layout.PROMPT_INDEX, layout.GENERATIONS, layout.ACTIVATION_INDEX,
                 layout.ERRORS)


def quarantine_malformed_lines(worker_dir: Path) -> int:
    """Move malformed complete lines of a worker's JSONL files to ``quarantine.jsonl``."""
    moved = 0
    for name in _WORKER_FILES:
        path = worker_dir / name
        if not path.exists():
            continue
        good, bad = [], []
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, start=1):
                try:  # what iter_lines accepts: a JSON object, or a blank line
                    if not raw.isspace() and not isinstance(json.loads(raw), dict):
                        raise ValueError("not a JSON object")
                    good.append(raw)
                except ValueError:  # JSONDecodeError and UnicodeDecodeError included
                    if raw.endswith(b"\n"):
                        bad.append({"file": name, "line": lineno,
                                    "raw": raw.decode("utf-8", "replace")})
                    else:
                        good.append(raw)  # a torn tail is the recovery's business
        if not bad:
            continue
        with open(worker_dir / "quarantine.jsonl", "a", encoding="utf-8") as q:
            for entry in bad:
                q.write(json.dumps(entry) + "\n")
            q.flush()
            os.fsync(q.fileno())
        tmp = path.with_name(path.name + ".partial")
        with open(tmp, "wb") as f:
            f.writelines(good)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        log.warning("%s: moved %d malformed line(s) to quarantine.jsonl", path, len(bad))
        moved += len(bad)
    return moved


def prompts_to_retry(root: Path, expected: set[str]) -> set[str]:
    """Prompt ids (of ``expected`` or of errors.jsonl) without a complete commit."""
    root = Path(root)
    manifest = load_manifest(root) or {}
    k = int(manifest.get("k_samples", 0))
    per_file = manifest.get("storage_format", "npy") == "npy"
    complete: set[str] = set()
    committed: set[str] = set()
    errored: set[str] = set()
    for wdir in layout.worker_dirs(root):
        quarantine_malformed_lines(wdir)
        gens: dict[str, set[int]] = defaultdict(set)
        acts: dict[str, set[int]] = defaultdict(set)
        for row in iter_rows(wdir / layout.GENERATIONS):
            gens[row.get("commit_id")].add(row.get("sample_id"))
        for row in iter_rows(wdir / layout.ACTIVATION_INDEX):
            if per_file and not (wdir / row.get("file_path", "")).is_file():
                continue
            acts[row.get("commit_id")].add(row.get("sample_id"))
        for row in iter_rows(wdir / layout.ERRORS):
            if row.get("prompt_id"):
                errored.add(row["prompt_id"])
        want = set(range(k + 1))
        for row in iter_rows(wdir / layout.PROMPT_INDEX):
            cid = row.get("commit_id")
            committed.add(row["prompt_id"])
            if gens.get(cid) == want and acts.get(cid) == want:
                complete.add(row["prompt_id"])
    retry = (set(expected) | errored) - complete
    if not per_file:
        # Shard stores are append-only: a committed sample's key cannot be written again.
        stuck = retry & committed
        if stuck:
            log.warning("%d committed prompt(s) lack some activations but a %s store cannot "
                        "rewrite their keys; they keep their generations without those "
                        "activations: %s", len(stuck), manifest.get("storage_format"),
                        ", ".join(sorted(stuck)[:10]))
        retry -= stuck
    return retry

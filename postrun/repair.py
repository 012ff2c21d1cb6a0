"""What ``hallulog retry`` reprocesses, and the quarantine of malformed worker lines.

A prompt is retried when it has no complete commit in any worker directory: a prompt row, K+1
generations and K+1 activations whose files exist (per-file formats). That covers the prompts
in ``errors.jsonl`` (failed generation, failed capture), the prompts of the task never done,
lines lost to corruption and activation files deleted after the fact.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from hallulog.contracts import layout
from hallulog.contracts.jsonl import encode_line, is_malformed, iter_rows
from hallulog.contracts.run_manifest import RunManifest
from hallulog.postrun.commits import MaskLookup, commit_key, id_rows
from hallulog.storage.registry import format_info

__all__ = ["prompts_to_retry", "quarantine_malformed_lines"]

log = logging.getLogger(__name__)

_WORKER_FILES = (layout.PROMPT_INDEX, layout.GENERATIONS, layout.ACTIVATION_INDEX, layout.ERRORS)


def quarantine_malformed_lines(worker_dir: Path) -> int:
    """Move malformed complete lines of a worker's JSONL files to ``quarantine.jsonl``.

    Streams each file once to look; only a file with such lines is rewritten (streamed to a
    ``.partial`` copy and renamed into place).
    """
    moved = 0
    for name in _WORKER_FILES:
        path = worker_dir / name
        if not path.exists():
            continue
        with open(path, "rb") as f:
            if not any(is_malformed(raw) for raw in f):
                continue
        tmp = path.with_name(path.name + ".partial")
        bad = 0
        with (
            open(path, "rb") as f,
            open(tmp, "wb") as good,
            open(worker_dir / layout.QUARANTINE, "ab") as q,
        ):
            for lineno, raw in enumerate(f, start=1):
                if is_malformed(raw):
                    q.write(
                        encode_line(
                            {"file": name, "line": lineno, "raw": raw.decode("utf-8", "replace")}
                        )
                    )
                    bad += 1
                else:
                    good.write(raw)
            q.flush()
            os.fsync(q.fileno())
            good.flush()
            os.fsync(good.fileno())
        os.replace(tmp, path)
        log.warning("%s: moved %d malformed line(s) to %s", path, bad, layout.QUARANTINE)
        moved += bad
    return moved


def prompts_to_retry(root: Path, expected: set[str]) -> set[str]:
    """Prompt ids (of ``expected`` or of errors.jsonl) without a complete commit.

    Each worker's files are read in lockstep by commit (postrun/commits.py): a few
    ints per commit read ahead, never the rows.
    """
    root = Path(root)
    manifest = RunManifest.load(root) or RunManifest()
    k = int(manifest.get("k_samples", 0))
    per_file = format_info(manifest.storage_format).file_per_activation
    full = (1 << (k + 1)) - 1
    complete: set[str] = set()
    committed: set[str] = set()
    errored: set[str] = set()
    for wdir in layout.worker_dirs(root):
        quarantine_malformed_lines(wdir)
        gens = MaskLookup(id_rows(wdir / layout.GENERATIONS), k)
        act_rows = iter_rows(wdir / layout.ACTIVATION_INDEX)
        if per_file:
            act_rows = (row for row in act_rows if (wdir / row.get("file_path", "")).is_file())
        acts = MaskLookup(act_rows, k)
        for row in iter_rows(wdir / layout.ERRORS):
            if row.get("prompt_id"):
                errored.add(row["prompt_id"])
        for row in iter_rows(wdir / layout.PROMPT_INDEX):
            committed.add(row["prompt_id"])
            key = commit_key(row)
            if gens.get(key) == full and acts.get(key) == full:
                complete.add(row["prompt_id"])
    retry = (set(expected) | errored) - complete
    if not per_file:
        # Append-only stores: a committed sample's key cannot be written again.
        stuck = retry & committed
        if stuck:
            log.warning(
                "%d committed prompt(s) lack some activations but a %s store cannot "
                "rewrite their keys; they keep their generations without those "
                "activations: %s",
                len(stuck),
                manifest.storage_format,
                ", ".join(sorted(stuck)[:10]),
            )
        retry -= stuck
    return retry

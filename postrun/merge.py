"""``python -m orchestrator merge --out ROOT SHARD_ROOT...``: join the shard roots of one run.

Each shard (``--shard I/N``) is a complete run in its own artifact root. Merging checks that the
roots are the N shards of one run — same config apart from the shard, every index 0..N-1 once,
every shard finished — then gives every shard's ``worker_{j}/`` a stable new name
``worker_{k}`` in the merged root (hard links by default, so nothing is copied; ``copy`` or
``move`` on request), writes a merged ``run_manifest.json`` (``merged_from`` maps each new
worker directory to its shard and original name), joins ``labels.jsonl``, and then runs the
normal post-run (``hallulog.postrun.finish``: consolidate → exports → validate). The merged
root is then a run like any other (``hallulog consolidate``, ``hallulog validate`` work on it).

Rows keep the ``worker_id`` they were written with; ``merged_from`` says where they came from.
A hard-linked merged root shares its files with the shard roots: leave the shards alone
afterwards (or merge with ``mode="copy"``).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from hallulog.config.plan import plan_recorded_task
from hallulog.contracts import layout
from hallulog.contracts.errors import HallulogError
from hallulog.contracts.jsonl import iter_rows
from hallulog.contracts.root_lock import LOCK_FILE, root_lock
from hallulog.contracts.run_manifest import RunManifest
from hallulog.tasks.shards import parse_shard

__all__ = ["merge_shards", "MergeRefused", "check_shards", "ShardRoot"]

log = logging.getLogger(__name__)

MergeMode = Literal["link", "copy", "move"]

# Besides the fingerprint, fields that decide which prompts a shard holds.
_SELECTION_FIELDS = ("limit", "task_path", "split")


class MergeRefused(HallulogError):
    """The given roots are not the complete, finished shards of one run (the message says why)."""


class ShardRoot:
    """One shard's artifact root, with what merging needs to know about it."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        manifest = _load_manifest(self.root)
        if manifest is None:
            raise MergeRefused(f"{self.root}: no {layout.MANIFEST} (not a hallulog artifact root)")
        self.manifest = manifest
        if not manifest.get("shard"):
            raise MergeRefused(
                f"{self.root}: not a shard (run without --shard); merge takes the "
                "roots of `run --shard I/N`"
            )
        self.spec = parse_shard(manifest["shard"])
        self.config: dict[str, Any] = manifest.get("config", {})

    @property
    def name(self) -> str:
        return f"shard {self.spec} ({self.root})"

    def committed(self) -> set[str]:
        """Prompt ids with a committed prompt_index line in any worker directory (read only)."""
        done: set[str] = set()
        for wdir in layout.worker_dirs(self.root):
            for row in iter_rows(wdir / layout.PROMPT_INDEX, malformed="skip"):
                done.add(row.get("prompt_id"))
        return done

    def expected(self) -> set[str]:
        """The prompt ids this shard has to hold (its task, limit and shard)."""
        try:  # the shard's own config, as its run read it
            return set(plan_recorded_task(self.manifest, shard=self.manifest["shard"]).prompt_ids)
        except (OSError, ValueError) as exc:
            raise MergeRefused(f"{self.name}: cannot load its prompts to check it: {exc}") from None


def check_shards(roots: Sequence[Path]) -> list[ShardRoot]:
    """The shards of ``roots`` sorted by index, or :class:`MergeRefused` naming every problem."""
    if not roots:
        raise MergeRefused("merge needs the shard roots to merge")
    shards = [ShardRoot(r) for r in roots]
    first = shards[0]
    problems: list[str] = []
    for s in shards[1:]:
        diffs = _config_diffs(first, s)
        if diffs:
            problems.append(
                f"{s.root} differs from {first.root} beyond the shard: " + "; ".join(diffs)
            )
    count = first.spec.count
    by_index: dict[int, list[ShardRoot]] = {}
    for s in shards:
        by_index.setdefault(s.spec.index, []).append(s)
    for index, same in sorted(by_index.items()):
        if len(same) > 1:
            problems.append(
                f"overlapping shards: {' and '.join(str(s.root) for s in same)} are "
                f"all shard {index}/{count}"
            )
    missing = [f"{i}/{count}" for i in range(count) if i not in by_index]
    if missing and not any("differs" in p for p in problems):
        problems.append(f"missing shard(s) {', '.join(missing)} (got {len(by_index)} of {count})")
    if problems:
        raise MergeRefused("; ".join(problems))

    owner: dict[str, ShardRoot] = {}
    for s in sorted(shards, key=lambda s: s.spec.index):
        expected, committed = s.expected(), s.committed()
        todo = sorted(expected - committed)
        if todo:
            problems.append(
                f"unfinished {s.name}: {len(expected) - len(todo)} of "
                f"{len(expected)} prompts committed (missing {', '.join(todo[:5])}"
                f"{' ...' if len(todo) > 5 else ''}); rerun its command to resume, "
                "or `hallulog retry`"
            )
        stray = sorted(committed - expected)
        if stray:
            problems.append(
                f"{s.name} holds {len(stray)} prompt(s) outside its shard (e.g. {stray[0]})"
            )
        for pid in committed & expected:
            if pid in owner:
                problems.append(
                    f"overlapping shards: prompt {pid} is in {owner[pid].root} and {s.root}"
                )
                break
            owner[pid] = s
    if problems:
        raise MergeRefused("; ".join(problems))
    return sorted(shards, key=lambda s: s.spec.index)


def _config_diffs(a: ShardRoot, b: ShardRoot) -> list[str]:
    out = []
    fa, fb = a.manifest.get("fingerprint_fields", {}), b.manifest.get("fingerprint_fields", {})
    for key in sorted(set(fa) | set(fb)):
        if fa.get(key) != fb.get(key):
            out.append(f"{key}: {fa.get(key)!r} vs {fb.get(key)!r}")
    for key in _SELECTION_FIELDS:
        if a.config.get(key) != b.config.get(key):
            out.append(f"{key}: {a.config.get(key)!r} vs {b.config.get(key)!r}")
    if a.spec.count != b.spec.count:
        out.append(f"shard count: {a.spec} vs {b.spec}")
    return out


def merge_shards(
    out: Path, roots: Sequence[Path], *, mode: MergeMode = "link", consolidate_after: bool = True
) -> dict[str, Any]:
    """Merge the shard ``roots`` into ``out``; returns a summary (validation included). Holds
    ``out``'s root lock (contracts/root_lock.py) while it writes."""
    started = time.monotonic()
    out = Path(out)
    shards = check_shards(roots)
    _check_out(out, shards)  # a refused merge writes nothing, not even the root's lock
    with root_lock(out, "merge"):
        return _merge_into(out, shards, mode, consolidate_after, started)


def _merge_into(
    out: Path, shards: list[ShardRoot], mode: MergeMode, consolidate_after: bool, started: float
) -> dict[str, Any]:
    from hallulog.postrun.finish import finish

    _prepare_out(out, shards)
    merged_from: list[dict[str, Any]] = []
    next_id = 0
    for s in shards:
        for wdir in layout.worker_dirs(s.root):
            target = layout.worker_dir(out, next_id)
            _place_tree(wdir, target, mode)
            merged_from.append(
                {
                    "worker_dir": target.name,
                    "shard": str(s.spec),
                    "source": str(s.root / wdir.name),
                    "run_id": s.manifest.get("run_id"),
                }
            )
            next_id += 1
    _join_labels(out, shards)

    completed = set().union(*(s.committed() for s in shards))
    expected = set().union(*(s.expected() for s in shards))
    manifest = _merged_manifest(out, shards, merged_from, completed)
    RunManifest(manifest).dump(out)
    _write_checkpoint(out, completed, manifest["run_id"])
    summary: dict[str, Any] = {
        "out": str(out),
        "shards": len(shards),
        "worker_dirs": len(merged_from),
        "prompts": len(completed),
        "mode": mode,
    }
    if consolidate_after:
        done = finish(out, expected_prompt_ids=expected)
        summary["consolidation"] = dict(done.consolidation)
        summary["exports"] = done.exports
        summary["validation"] = done.validation
    summary["seconds"] = round(time.monotonic() - started, 3)
    log.info(
        "merged %d shards (%d worker dirs, %d prompts) into %s in %.2f s",
        len(shards),
        len(merged_from),
        len(completed),
        out,
        summary["seconds"],
    )
    return summary


def _check_out(out: Path, shards: list[ShardRoot]) -> None:
    """``out`` must be new, empty, or an earlier merge (whose merged parts are redone)."""
    sources = {s.root.resolve() for s in shards}
    if out.resolve() in sources:
        raise MergeRefused(f"--out {out} is one of the shard roots; pick a new directory")
    if out.exists() and any(p.name != LOCK_FILE for p in out.iterdir()):
        previous = _load_manifest(out)
        if previous is None or "merged_from" not in previous:
            raise MergeRefused(
                f"--out {out} exists and is not an earlier merge; pick an empty or new directory"
            )


def _prepare_out(out: Path, shards: list[ShardRoot]) -> None:
    """Clear what an earlier merge into ``out`` left (checked by :func:`_check_out`)."""
    _check_out(out, shards)
    if out.exists() and any(p.name != LOCK_FILE for p in out.iterdir()):
        for wdir in layout.worker_dirs(out):
            shutil.rmtree(wdir)
        for stale in (layout.consolidated_dir(out), out / layout.LABELS):
            if stale.is_dir():
                shutil.rmtree(stale)
            elif stale.exists():
                stale.unlink()
    out.mkdir(parents=True, exist_ok=True)


def _place_tree(src: Path, dst: Path, mode: MergeMode) -> None:
    if mode == "move":
        try:
            os.rename(src, dst)
            return
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            shutil.copytree(src, dst)
            shutil.rmtree(src)
            return
    for dirpath, _dirs, files in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            a, b = Path(dirpath) / name, dst / rel / name
            if mode == "link":
                try:
                    os.link(a, b)
                    continue
                except OSError as exc:
                    if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                        raise
            shutil.copy2(a, b)


def _join_labels(out: Path, shards: list[ShardRoot]) -> None:
    sources = [s.root / layout.LABELS for s in shards if (s.root / layout.LABELS).exists()]
    if not sources:
        return
    tmp = out / (layout.LABELS + ".partial")
    with open(tmp, "w", encoding="utf-8") as f:
        for path in sources:
            for row in iter_rows(path, malformed="skip"):
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out / layout.LABELS)


def _write_checkpoint(out: Path, completed: set[str], run_id: str) -> None:
    """``completed_prompts.json`` of the merged root, in the run's format
    (``hallulog.orchestrator.run.checkpoint``; not imported: post-run stays independent of the run)."""
    body = {
        "run_id": run_id,
        "updated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "count": len(completed),
        "completed": sorted(completed),
    }
    tmp = out / (layout.CHECKPOINT + ".partial")
    tmp.write_text(json.dumps(body), encoding="utf-8")
    os.replace(tmp, out / layout.CHECKPOINT)


def _merged_manifest(
    out: Path, shards: list[ShardRoot], merged_from: list[dict[str, Any]], completed: set[str]
) -> dict[str, Any]:
    base = dict(shards[0].manifest)
    for key in ("consolidation", "resumed_at"):
        base.pop(key, None)
    config = {**base.get("config", {}), "shard": None, "artifact_root": str(out)}
    finished = [s.manifest.get("finished_at") for s in shards if s.manifest.get("finished_at")]
    base.update(
        run_id=str(uuid.uuid4()),
        artifact_root=str(out),
        shard=None,
        config=config,
        worker_count=len(merged_from),
        total_prompts=len(completed),
        completed_prompt_ids=sorted(completed),
        timestamp=min(s.manifest.get("timestamp", "") for s in shards),
        finished_at=max(finished) if finished else None,
        merged_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        merged_from=merged_from,
        shard_runs=[
            {
                "shard": str(s.spec),
                "root": str(s.root),
                "run_id": s.manifest.get("run_id"),
                "total_prompts": s.manifest.get("total_prompts"),
            }
            for s in shards
        ],
    )
    return base


def _load_manifest(root: Path) -> dict[str, Any] | None:
    manifest = RunManifest.load(root)
    return manifest.to_dict() if manifest is not None else None

"""Consolidation (seed 003 §11.2): merge every worker's output into ``consolidated/``.

- JSONL rows are streamed worker by worker; only complete prompt groups (a prompt row and K+1
  generations) are kept, each prompt once (the latest commit wins when a prompt was committed
  twice, e.g. by ``hallulog retry``) and each (prompt_id, sample_id) once. Memory is a few
  numbers per committed prompt (postrun/commits.py), never the rows: a first pass
  picks the commits, a second merge-joins each worker's three files (written in commit order).
- Per-file activations (npy) are hard-linked into ``consolidated/activations/`` (copied only
  across filesystems); shard formats get a manifest over the worker stores (no copy), or a
  physical merge with ``merge=True``.
- Labels from ``labels.jsonl`` (the judge, after the run) are joined into the prompt rows.
- The method exports (exports/methods.py) are written in the same pass.
- The same rows go, in row groups, into ``prompts/generations/activation_index/labels.parquet``
  (postrun/parquet.py, docs/formats/parquet.md).
- ``run_manifest.json`` gets a ``consolidation`` block.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from collections import defaultdict
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from hallulog.contracts import layout
from hallulog.contracts.errors import ArtifactError
from hallulog.contracts.jsonl import encode_line, iter_lines, iter_rows
from hallulog.contracts.run_manifest import RunManifest
from hallulog.exports.methods import ExportWriter, stamp_exports
from hallulog.postrun.commits import KeptCommits, RunCursor, pick_commits, scan_worker
from hallulog.postrun.labels import LabelIndex, apply_label, load_labels
from hallulog.storage.registry import format_info

from hallulog import storage

if TYPE_CHECKING:
    from hallulog.postrun.parquet import ParquetTables

__all__ = ["consolidate", "ConsolidationResult"]

log = logging.getLogger(__name__)


class ConsolidationResult(dict):
    """The consolidation block written into run_manifest.json."""


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


def _with_label(raw: bytes, label: int) -> bytes | None:
    """``encode_line({**row, "label": label})`` from the row's compact bytes, when certain:
    the row has no ``label`` key yet, so the key goes last."""
    if b'"label":' in raw or not raw.endswith(b"}\n"):
        return None
    head = raw[:-2]
    return b'%s%s"label":%d}\n' % (head, b"," if head.strip() != b"{" else b"", label)


def _copy_worker(
    wdir: Path,
    kept: KeptCommits,
    keep: Any,
    *,
    k: int,
    per_file: bool,
    labels: LabelIndex,
    act_dir: Path,
    out: dict[str, IO[bytes]],
    counts: dict[str, int],
    modes: dict[str, int],
    tables: ParquetTables,
    exports: ExportWriter,
    exports_failed: list[BaseException],
) -> None:
    """Stream one worker's kept commits into the consolidated files (all three in lockstep)."""
    gens = RunCursor(iter_lines(wdir / layout.GENERATIONS), kept)
    acts = RunCursor(iter_lines(wdir / layout.ACTIVATION_INDEX), kept)
    write_prompt = out[layout.PROMPT_INDEX].write
    write_gen = out[layout.GENERATIONS].write
    write_act = out[layout.ACTIVATION_INDEX].write
    for line, row in enumerate(iter_rows(wdir / layout.PROMPT_INDEX)):
        if line >= len(keep) or not keep[line]:
            continue
        row = apply_label(row, labels.get(row["prompt_id"]))
        write_prompt(encode_line(row))
        tables.add_prompt(row)
        # readers of the store take each sample's label from the activation rows
        sample_labels: dict[int, Any] = {0: row.get("label")}
        seen: set[int] = set()
        kept_gens = []
        for gen_line in gens.take(line):
            gen = gen_line.row
            sid = gen["sample_id"]
            if sid in seen:
                continue
            seen.add(sid)
            kept_gens.append(gen)
            sample_labels.setdefault(sid, gen.get("label"))
            write_gen(gen_line.raw)  # the row as it was: the worker's own bytes
            tables.add_generation(gen, gen_line.raw)
        if len(seen) != k + 1:
            raise ArtifactError(
                f"{wdir / layout.GENERATIONS}: the generations of prompt {row['prompt_id']} "
                f"(commit {row.get('commit_id')}) are not in commit order; consolidation "
                "expects each group's rows together and groups in prompt_index.jsonl order "
                "(workers/persist.py)"
            )
        counts["generations"] += len(seen)
        primary_act = None
        for act_line in acts.take(line):
            act = act_line.row
            if per_file:  # a file per activation: linked, the index line names the link
                src = wdir / act["file_path"]
                modes[_link_or_copy(src, act_dir / src.name)] += 1
                act = {
                    **act,
                    "file_path": f"activations/{src.name}",
                    "source_path": f"{wdir.name}/{act['file_path']}",
                }
            label = sample_labels.get(act["sample_id"])
            label = -1 if label is None else int(label)
            line_out = _with_label(act_line.raw, label) if act is act_line.row else None
            act = {**act, "label": label}
            counts["total_bytes"] += int(act.get("size_bytes") or 0)
            counts["activations"] += 1
            if line_out is not None:  # the worker's line plus the label: parses back to act
                tables.add_activation(act, line_out)
            else:
                line_out = encode_line(act)
                tables.add_activation(act, line_out, act)
            write_act(line_out)
            if act["sample_id"] == 0:
                primary_act = act
        kept_gens.sort(key=lambda g: g["sample_id"])
        if not exports_failed:
            try:
                exports.add(row, kept_gens, primary_act)
            except Exception as exc:  # noqa: BLE001 - the exports step reports it on its own
                log.warning(
                    "exports not written with the consolidation (%s: %s); "
                    "write_exports will redo them",
                    type(exc).__name__,
                    exc,
                )
                exports_failed.append(exc)


def consolidate(root: Path, *, merge: bool = False) -> ConsolidationResult:
    """Merge ``worker_*`` into ``root/consolidated``; returns the consolidation metadata."""
    started = time.monotonic()
    root = Path(root)
    manifest = RunManifest.load(root)
    if manifest is None:
        raise ArtifactError(f"{RunManifest.path(root)}: no run here to consolidate")
    k = int(manifest["k_samples"])
    fmt = manifest.storage_format
    per_file = format_info(fmt).file_per_activation
    out = layout.consolidated_dir(root)
    out.mkdir(exist_ok=True)
    wdirs = layout.worker_dirs(root)
    scans = [scan_worker(wdir, k) for wdir in wdirs]
    chosen = pick_commits(scans)
    kept_prompts = int(sum(int(c.sum()) for c in chosen))
    labels = load_labels(root)
    counts = {"generations": 0, "activations": 0, "total_bytes": 0}
    modes: dict[str, int] = defaultdict(int)
    act_dir = layout.activations_dir(out)

    tmp = {
        name: open(out / f"{name}.partial", "wb")
        for name in (layout.PROMPT_INDEX, layout.GENERATIONS, layout.ACTIVATION_INDEX)
    }
    from hallulog.postrun.parquet import ParquetTables  # pyarrow: only when consolidating

    tables = ParquetTables(out)
    exports = ExportWriter(root)
    exports_failed: list[BaseException] = []
    published = False
    try:
        if per_file:
            act_dir.mkdir(exist_ok=True)
        for wdir, scan, keep in zip(wdirs, scans, chosen):
            _copy_worker(
                wdir,
                KeptCommits(scan, keep),
                keep,
                k=k,
                per_file=per_file,
                labels=labels,
                act_dir=act_dir,
                out=tmp,
                counts=counts,
                modes=modes,
                tables=tables,
                exports=exports,
                exports_failed=exports_failed,
            )
        for f in tmp.values():
            f.flush()
            os.fsync(f.fileno())
        for f in tmp.values():
            f.close()
        for name in tmp:
            os.replace(out / f"{name}.partial", out / name)
        parquet_rows = tables.close(commit=True)
        if exports_failed:
            exports.close(commit=False)
        else:
            stamp_exports(root, exports.close(commit=True))
        published = True
    finally:
        for f in tmp.values():
            f.close()
        labels.close()
        if not published:
            tables.close(commit=False)
            exports.close(commit=False)

    if not per_file:  # append-only stores: a manifest over them, or one merged store
        stores = [
            storage.store_dir(w)
            for w in layout.worker_dirs(root)
            if os.path.exists(storage.store_dir(w))
        ]
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
        timestamp=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        prompts=kept_prompts,
        generations=counts["generations"],
        activations=counts["activations"],
        total_bytes=counts["total_bytes"],
        parquet=parquet_rows,
        activation_modes=dict(modes),
        seconds=round(time.monotonic() - started, 3),
        path=layout.CONSOLIDATED,
    )
    manifest.replace(consolidation=dict(result)).dump(root)
    log.info(
        "consolidated %d prompts, %d generations, %d activations in %.2f s",
        kept_prompts,
        counts["generations"],
        counts["activations"],
        result["seconds"],
    )
    return result

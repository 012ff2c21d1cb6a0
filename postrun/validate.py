"""Validation (seed 003 §12): collect every problem of a run's artifacts, then report them all.

Writes ``consolidated/validation_report.json`` and returns it; each problem names its class,
file and line (where it has one), and the report carries the repair command of each class.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

import numpy as np

from hallulog import storage
from hallulog.storage.attention_format import done_keys, has_attention
from hallulog.storage.errors import UnknownFormatError
from hallulog.storage.registry import format_info
from hallulog.contracts import layout
from hallulog.contracts.jsonl import iter_rows, scan_lines
from hallulog.contracts.errors import ArtifactError
from hallulog.contracts.run_manifest import RunManifest
from hallulog.postrun.row_schemas import PROMPT_ID_RE, SCHEMAS, schema_errors

__all__ = ["validate", "SCHEMAS", "REPAIRS", "format_report", "schema_errors"]

log = logging.getLogger(__name__)

REPAIRS = {
    "attention_part_unreadable": "delete the part named, then run again (the attention pass "
                                 "redoes its generations)",
    "malformed_line": "hallulog retry --artifact-root {root}",
    "schema_violation": "hallulog retry --artifact-root {root}",
    "consolidated_malformed_line": "hallulog consolidate --artifact-root {root}",
    "missing_samples": "hallulog retry --artifact-root {root}",
    "incomplete_prompts": "hallulog retry --artifact-root {root}",
    "missing_activation": "hallulog retry --artifact-root {root}",
    "activations_missing": "fix the capture errors in worker_*/errors.jsonl, then hallulog retry "
                           "--artifact-root {root}",
    "missing_activation_file": "hallulog consolidate --artifact-root {root} (or hallulog retry "
                               "when the worker file is gone too)",
    "activation_mismatch": "hallulog retry --artifact-root {root}",
    "orphaned_activation": "hallulog consolidate --artifact-root {root}",
    "duplicate_id": "hallulog consolidate --artifact-root {root}",
    "missing_label": "hallulog consolidate --artifact-root {root} (after labelling: see "
                     "docs/labels.md)",
    "not_consolidated": "hallulog consolidate --artifact-root {root}",
}

#: Share of generations allowed to lack activations (capture failures) before validation fails
#: (docs/architecture.md): every profile asks for activations, and a run that captured almost
#: nothing (e.g. a foreign server on the port) must not say "validation OK".
MAX_MISSING_ACTIVATION_SHARE = 0.05

# Classes that make the artifacts incomplete (non-zero exit); the rest are warnings.
_FATAL = {"activations_missing", "malformed_line", "schema_violation", "consolidated_malformed_line", "missing_samples",
          "incomplete_prompts", "missing_activation_file", "activation_mismatch", "duplicate_id",
          "not_consolidated"}


class _Report:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.problems: list[dict[str, Any]] = []

    def add(self, cls: str, message: str, *, file: Path | None = None, line: int | None = None,
            prompt_id: str | None = None, **extra: Any) -> None:
        entry = {"class": cls, "message": message,
                 "file": str(file.relative_to(self.root)) if file else None, "line": line,
                 "prompt_id": prompt_id, **extra}
        self.problems.append(entry)


def _scan(path: Path, report: _Report, *, consolidated: bool) -> Iterator[tuple[int, dict]]:
    """Rows of a JSONL file, streamed, reporting malformed lines and schema violations."""
    name = path.name
    for lineno, row, problem in scan_lines(path):
        if problem is not None:
            cls = "consolidated_malformed_line" if consolidated else "malformed_line"
            report.add(cls, problem, file=path, line=lineno)
            continue
        errs = schema_errors(name, row)
        if errs:
            cls = "consolidated_malformed_line" if consolidated else "schema_violation"
            report.add(cls, "; ".join(errs), file=path, line=lineno,
                       prompt_id=row.get("prompt_id") if isinstance(row, dict) else None)
            continue
        yield lineno, row


def validate(root: Path, *, expected_prompt_ids: set[str] | None = None,
             manifest: RunManifest | None = None) -> dict[str, Any]:
    """Check a run's artifacts; write and return ``consolidated/validation_report.json``.

    ``manifest``: the run's, when the caller loaded it already (else read here)."""
    root = Path(root)
    report = _Report(root)
    if manifest is None:
        manifest = RunManifest.load(root) or RunManifest()
    k = int(manifest.get("k_samples", 0))
    per_file = _file_per_activation(manifest.storage_format)

    for wdir in layout.worker_dirs(root):
        for name in SCHEMAS:
            for _ in _scan(wdir / name, report, consolidated=False):
                pass

    out = layout.consolidated_dir(root)
    counts: dict[str, Any] = {}
    if not (out / layout.PROMPT_INDEX).exists():
        report.add("not_consolidated", f"no {layout.CONSOLIDATED}/{layout.PROMPT_INDEX}", file=None)
    else:
        counts = _check_consolidated(out, report, k=k, per_file=per_file,
                                     expected_prompt_ids=expected_prompt_ids)

    if has_attention(root):  # --attention-features: what the parts hold (not fatal)
        try:
            counts["attention_generations"] = len(done_keys(root))
        except ArtifactError as exc:
            report.add("attention_part_unreadable", str(exc), file=None)
    by_class = Counter(p["class"] for p in report.problems)
    body = {
        "ok": not any(c in _FATAL for c in by_class),
        "checked_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "artifact_root": str(root),
        "k_samples": k,
        "counts": counts,
        "problem_counts": dict(by_class),
        "repair": {c: REPAIRS[c].format(root=root) for c in by_class},
        "problems": report.problems,
    }
    out.mkdir(exist_ok=True)
    path = out / layout.VALIDATION_REPORT
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(body, indent=2))
    os.replace(tmp, path)
    return body


def _pid(prompt_id: str) -> int:
    return int(prompt_id, 16)  # the schema checked 16 hex digits


def _file_per_activation(fmt: str) -> bool:
    """Whether the run's activations are files of their own (the storage registry's word; an
    unknown format: no, the store's own check says what is there)."""
    try:
        return format_info(fmt).file_per_activation
    except UnknownFormatError:
        return False


def _check_consolidated(out: Path, report: _Report, *, k: int, per_file: bool,
                        expected_prompt_ids: set[str] | None) -> dict[str, Any]:
    """Cross-file checks with a few ints per prompt: every file is streamed.

    Problems are gathered per class and reported in a fixed order (the order of the checks).
    Where a problem needs the line of an earlier row (duplicates, orphans), the file is read a
    second time for the few keys concerned.
    """
    p_path, g_path = out / layout.PROMPT_INDEX, out / layout.GENERATIONS
    a_path = out / layout.ACTIVATION_INDEX
    found = _Report(report.root)  # problems of the cross checks, appended after the scans

    # prompts: first line per prompt id; duplicates kept apart (rare)
    prompt_line: dict[int, int] = {}
    prompt_dups: dict[int, list[int]] = {}
    for line, row in _scan(p_path, report, consolidated=True):
        pid = _pid(row["prompt_id"])
        if row.get("label") is None:
            found.add("missing_label", "prompt has no label", file=p_path, line=line,
                      prompt_id=row["prompt_id"])
        if pid in prompt_line:
            prompt_dups.setdefault(pid, [prompt_line[pid]]).append(line)
        else:
            prompt_line[pid] = line
    for pid, lines in sorted(prompt_dups.items(), key=lambda kv: kv[1][0]):
        found.add("duplicate_id", f"prompt_id repeated on lines {lines}", file=p_path,
                  line=lines[1], prompt_id=f"{pid:016x}")

    # activations (small rows) before generations: per prompt a bit mask of sample ids
    act_mask: dict[int, int] = {}
    act_dup_keys: set[str] = set()
    act_checks = _Report(report.root)
    listed = _KeySet()  # npy: file names the index names
    checker = (_npy_checker(out, act_checks, listed) if per_file
               else _store_checker(out, act_checks))
    seen_keys = _KeySet()
    a_scan, g_scan = _Report(report.root), _Report(report.root)
    try:
        act_count = _stream_activations(a_path, a_scan, act_mask, seen_keys, act_dup_keys,
                                        checker)
    finally:
        getattr(checker, "close", lambda: None)()

    gen_mask: dict[int, int] = {}
    gen_dups: set[tuple[int, int]] = set()
    missing_act = _Report(report.root)
    gen_count = 0
    for line, row in _scan(g_path, g_scan, consolidated=True):
        pid, bit = _pid(row["prompt_id"]), 1 << row["sample_id"]
        mask = gen_mask.get(pid, 0)
        if mask & bit:
            gen_dups.add((pid, row["sample_id"]))
        else:
            gen_mask[pid] = mask | bit
            gen_count += 1
        if not act_mask.get(pid, 0) & bit:
            missing_act.add("missing_activation", "generation has no activations (capture "
                            "failed?)", file=g_path, line=line, prompt_id=row["prompt_id"])
    if gen_dups:
        lines_of: dict[tuple[int, int], list[int]] = {key: [] for key in gen_dups}
        for line, row in _scan(g_path, _Report(report.root), consolidated=True):
            key = (_pid(row["prompt_id"]), row["sample_id"])
            if key in lines_of:
                lines_of[key].append(line)
        for (pid, sid), lines in sorted(lines_of.items(), key=lambda kv: kv[1][0]):
            found.add("duplicate_id", f"generation ({pid:016x}, {sid}) repeated on lines "
                      f"{lines}", file=g_path, line=lines[1], prompt_id=f"{pid:016x}")
    for pid, line in prompt_line.items():
        have = gen_mask.get(pid, 0).bit_count()
        if have < k + 1:
            found.add("missing_samples", f"{have} of {k + 1} generations", file=p_path,
                      line=line, prompt_id=f"{pid:016x}")
    if expected_prompt_ids is not None:
        missing = sorted(p for p in expected_prompt_ids
                         if not PROMPT_ID_RE.match(p) or _pid(p) not in prompt_line)
        for pid in missing:
            found.add("incomplete_prompts", "prompt of the task not completed", prompt_id=pid)

    orphans = any(mask & ~gen_mask.get(pid, 0) for pid, mask in act_mask.items())
    if orphans or act_dup_keys:
        dup_lines: dict[str, list[int]] = {key: [] for key in act_dup_keys}
        for line, row in _scan(a_path, _Report(report.root), consolidated=True):
            if not gen_mask.get(_pid(row["prompt_id"]), 0) & (1 << row["sample_id"]):
                found.add("orphaned_activation", "activation without a generation",
                          file=a_path, line=line, prompt_id=row["prompt_id"])
            if row["activation_key"] in dup_lines:
                dup_lines[row["activation_key"]].append(line)
        for key, lines in sorted(dup_lines.items(), key=lambda kv: kv[1][0]):
            found.add("duplicate_id", f"activation_key {key} repeated on lines {lines}",
                      file=a_path, line=lines[1])
    if gen_count and len(missing_act.problems) > MAX_MISSING_ACTIVATION_SHARE * gen_count:
        found.add("activations_missing",
                  f"{len(missing_act.problems)} of {gen_count} generations have no activations "
                  f"(more than {MAX_MISSING_ACTIVATION_SHARE:.0%}); most common cause: "
                  f"{_capture_error_cause(out.parent)}", file=a_path)
    if per_file:
        _orphan_npy_files(out, listed, act_checks)
    for part in (g_scan, a_scan, found, missing_act, act_checks):
        report.problems.extend(part.problems)
    return {"prompts": len(prompt_line), "generations": gen_count, "activations": act_count}


def _stream_activations(path: Path, report: _Report, masks: dict[int, int], keys: _KeySet,
                        dups: set[str], checker: Callable[[int, dict], None] | None) -> int:
    """One pass over the consolidated activation index; returns the number of distinct keys."""
    count = 0
    for line, row in _scan(path, report, consolidated=True):
        pid = _pid(row["prompt_id"])
        masks[pid] = masks.get(pid, 0) | (1 << row["sample_id"])
        key = row["activation_key"]
        if keys.add(key):
            dups.add(key)
        else:
            count += 1
        if checker is not None:
            checker(line, row)
    return count


class _KeySet:
    """A set of strings held as 64-bit hashes in sorted numpy blocks (8 bytes per key)."""

    def __init__(self) -> None:
        self._recent: set[int] = set()
        self._blocks: list[np.ndarray] = []

    def __contains__(self, key: str) -> bool:
        h = hash(key)
        if h in self._recent:
            return True
        return any(_in_sorted(b, h) for b in self._blocks)

    def add(self, key: str) -> bool:
        """Add ``key``; True when it was there already."""
        if key in self:
            return True
        self._recent.add(hash(key))
        if len(self._recent) >= 65536:
            self._blocks.append(np.sort(np.fromiter(self._recent, dtype=np.int64)))
            self._recent = set()
            if len(self._blocks) > 8:
                self._blocks = [np.sort(np.concatenate(self._blocks))]
        return False


def _in_sorted(block: np.ndarray, h: int) -> bool:
    i = int(np.searchsorted(block, h))
    return i < len(block) and int(block[i]) == h


def _npy_checker(out: Path, report: _Report, listed: _KeySet) -> Callable[[int, dict], None]:
    a_path = out / layout.ACTIVATION_INDEX

    def check(line: int, row: dict) -> None:
        path = out / row["file_path"]
        listed.add(path.name)
        try:
            arr = np.load(path, mmap_mode="r")
        except FileNotFoundError:
            report.add("missing_activation_file", f"{row['file_path']} does not exist",
                       file=a_path, line=line, prompt_id=row["prompt_id"])
            return
        except (ValueError, OSError) as exc:
            report.add("activation_mismatch", f"{row['file_path']} unreadable: {exc}",
                       file=a_path, line=line, prompt_id=row["prompt_id"])
            return
        # a bfloat16 file's header says uint16 (its container: docs/formats/npy.md "dtype")
        held = "bfloat16" if row["dtype"] == "bfloat16" and arr.dtype.str == "<u2" else arr.dtype.name
        if list(arr.shape) != row["shape"] or held != row["dtype"]:
            report.add("activation_mismatch",
                       f"{row['file_path']} is {list(arr.shape)} {arr.dtype.name}, index says "
                       f"{row['shape']} {row['dtype']}", file=a_path, line=line,
                       prompt_id=row["prompt_id"])

    return check


def _orphan_npy_files(out: Path, keys: _KeySet, report: _Report) -> None:
    """Files in ``activations/`` that no index row names."""
    act_dir = layout.activations_dir(out)
    if not act_dir.exists():
        return
    with os.scandir(act_dir) as entries:
        for entry in entries:
            if entry.name.endswith(".npy") and entry.name not in keys:
                report.add("orphaned_activation", "activation file not in the index",
                           file=act_dir / entry.name)


def _store_checker(out: Path, report: _Report) -> Callable[[int, dict], None] | None:
    a_path = out / layout.ACTIVATION_INDEX
    try:
        reader = storage.open_store(layout.activations_dir(out))
    except (storage.StorageError, OSError, ValueError) as exc:
        report.add("missing_activation_file", f"activation store unreadable: {exc}",
                   file=layout.activations_dir(out))
        return None
    try:
        # key → position, as sorted 64-bit hashes (16 bytes per key, not a dict of strings)
        hashes = np.fromiter((hash(k) for k in reader.keys()), dtype=np.int64)
    except BaseException:
        reader.close()
        raise
    order = np.argsort(hashes, kind="stable")
    hashes = hashes[order]

    def check(line: int, row: dict) -> None:
        key = row["activation_key"]
        h = hash(key)
        i = int(np.searchsorted(hashes, h))
        found = None
        while i < len(hashes) and int(hashes[i]) == h:  # a hash shared by two keys
            j = int(order[i])
            if reader.meta(j)["sample_key"] == key:
                found = j  # the last one wins, as a dict built over the keys would
            i += 1
        if found is None:
            report.add("missing_activation_file", f"{key} not in the activation store",
                       file=a_path, line=line, prompt_id=row["prompt_id"])
        elif reader.seq_len(found) != row["shape"][1]:
            report.add("activation_mismatch",
                       f"{key}: store holds {reader.seq_len(found)} rows, index says "
                       f"{row['shape'][1]}", file=a_path, line=line, prompt_id=row["prompt_id"])

    check.close = reader.close  # type: ignore[attr-defined]
    return check


def _capture_error_cause(root: Path) -> str:
    """The most frequent ``capture_failed`` message of the workers' errors.jsonl, or the
    captures whose rows failed the check, per reason (``capture_zeros`` …), when they are more."""
    causes: Counter = Counter()
    reasons: Counter = Counter()
    for wdir in layout.worker_dirs(root):
        for row in iter_rows(wdir / layout.ERRORS, malformed="skip"):
            if row.get("error_type") == "capture_failed":
                if row.get("reason"):
                    reasons[str(row["reason"])] += 1
                else:
                    causes[str(row.get("error_message", "?"))[:200]] += 1
    if not causes and not reasons:
        return "unknown (no capture_failed rows in worker_*/errors.jsonl)"
    if sum(reasons.values()) >= max(causes.values(), default=0):
        named = ", ".join(f"{n} {reason}" for reason, n in reasons.most_common())
        return f"rows that failed the capture check: {named} (worker_*/errors.jsonl, docs/alignment.md)"
    message, n = causes.most_common(1)[0]
    return f"{message} ({n} time(s), worker_*/errors.jsonl)"


def format_report(report: dict[str, Any], limit: int = 10) -> str:
    """Short terminal summary: counts per class, a few examples, the repair commands."""
    lines = [f"validation {'OK' if report['ok'] else 'FAILED'}: {report['counts']}"]
    for cls, n in sorted(report["problem_counts"].items()):
        lines.append(f"  {cls}: {n}  → repair: {report['repair'][cls]}")
        for p in [p for p in report["problems"] if p["class"] == cls][:3]:
            where = f"{p['file']}:{p['line']}" if p.get("line") else (p.get("file") or "")
            lines.append(f"      {where} {p.get('prompt_id') or ''} {p['message']}".rstrip())
    path = layout.consolidated_dir(report["artifact_root"]) / layout.VALIDATION_REPORT
    lines.append(f"report: {path}")
    return "\n".join(lines)

"""Validation (seed 003 §12): collect every problem of a run's artifacts, then report them all.

Writes ``consolidated/validation_report.json`` and returns it; each problem names its class,
file and line (where it has one), and the report carries the repair command of each class.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable

import numpy as np

import storage

from contracts import layout
from orchestrator.manifest import load_manifest

__all__ = ["validate", "SCHEMAS", "REPAIRS", "format_report", "schema_errors"]

log = logging.getLogger(__name__)

_HEX16 = re.compile(r"^[0-9a-f]{16}$")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _label_ok(v: Any) -> bool:
    return v is None or v in (0, 1)


def _logprobs_ok(v: Any) -> bool:
    return isinstance(v, list) and all(
        isinstance(t, dict) and "token" in t and isinstance(t.get("logprob"), (int, float))
        and isinstance(t.get("top_logprobs"), list) for t in v)


SCHEMAS: dict[str, dict[str, Callable[[Any], bool]]] = {
    layout.PROMPT_INDEX: {
        "prompt_id": lambda v: isinstance(v, str) and bool(_HEX16.match(v)),
        "dataset_id": lambda v: isinstance(v, str),
        "prompt": lambda v: isinstance(v, str),
        "label": _label_ok,
        "meta": lambda v: isinstance(v, dict),
    },
    layout.GENERATIONS: {
        "prompt_id": lambda v: isinstance(v, str) and bool(_HEX16.match(v)),
        "sample_id": lambda v: _is_int(v) and v >= 0,
        "role": lambda v: v in ("primary", "sample"),
        "text": lambda v: isinstance(v, str),
        "finish_reason": lambda v: v is None or isinstance(v, str),
        "usage": lambda v: isinstance(v, dict),
        "logprobs": _logprobs_ok,
        "token_ids": lambda v: isinstance(v, list),
        "request_params": lambda v: isinstance(v, dict),
        "generation_time_ms": _is_int,
    },
    layout.ACTIVATION_INDEX: {
        "prompt_id": lambda v: isinstance(v, str) and bool(_HEX16.match(v)),
        "sample_id": lambda v: _is_int(v) and v >= 0,
        "activation_key": lambda v: isinstance(v, str),
        "layers": lambda v: isinstance(v, list) or v == "all",
        "sequence_mode": lambda v: v in ("all", "prompt", "response", "last"),
        "prompt_token_count": _is_int,
        "response_token_count": _is_int,
        "shape": lambda v: isinstance(v, list) and len(v) == 3 and all(map(_is_int, v)),
        "dtype": lambda v: v in ("float16", "float32"),
        "size_bytes": _is_int,
        "worker_id": _is_int,
    },
    layout.ERRORS: {
        "timestamp": lambda v: isinstance(v, str),
        "error_type": lambda v: isinstance(v, str),
        "prompt_id": lambda v: v is None or isinstance(v, str),
        "sample_id": lambda v: v is None or _is_int(v),
        "error_message": lambda v: isinstance(v, str),
        "stack_trace": lambda v: isinstance(v, str),
    },
}

REPAIRS = {
    "malformed_line": "python -m orchestrator run --artifact-root {root} --retry-failed",
    "schema_violation": "python -m orchestrator run --artifact-root {root} --retry-failed",
    "consolidated_malformed_line": "python -m orchestrator run --artifact-root {root} "
                                   "--consolidate-only",
    "missing_samples": "python -m orchestrator run --artifact-root {root} --retry-failed",
    "incomplete_prompts": "python -m orchestrator run --artifact-root {root} --retry-failed",
    "missing_activation": "python -m orchestrator run --artifact-root {root} --retry-failed",
    "missing_activation_file": "python -m orchestrator run --artifact-root {root} "
                               "--consolidate-only (or --retry-failed when the worker file is "
                               "gone too)",
    "activation_mismatch": "python -m orchestrator run --artifact-root {root} --retry-failed",
    "orphaned_activation": "python -m orchestrator run --artifact-root {root} --consolidate-only",
    "duplicate_id": "python -m orchestrator run --artifact-root {root} --consolidate-only",
    "missing_label": "python -m orchestrator run --artifact-root {root} --consolidate-only "
                     "(after labelling: see docs/labels.md)",
    "not_consolidated": "python -m orchestrator run --artifact-root {root} --consolidate-only",
}

# Classes that make the artifacts incomplete (non-zero exit); the rest are warnings.
_FATAL = {"malformed_line", "schema_violation", "consolidated_malformed_line", "missing_samples",
          "incomplete_prompts", "missing_activation_file", "activation_mismatch", "duplicate_id",
          "not_consolidated"}


def schema_errors(name: str, row: Any) -> list[str]:
    """Field-level problems of one row of JSONL file ``name``."""
    if not isinstance(row, dict):
        return ["row is not a JSON object"]
    errs = []
    for key, ok in SCHEMAS.get(name, {}).items():
        if key not in row:
            errs.append(f"missing field {key!r}")
        elif not ok(row[key]):
            errs.append(f"field {key!r} has an invalid value {str(row[key])[:60]!r}")
    return errs


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


def _scan(path: Path, report: _Report, *, consolidated: bool) -> list[tuple[int, dict]]:
    """Rows of a JSONL file, reporting malformed lines and schema violations."""
    rows = []
    if not path.exists():
        return rows
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except json.JSONDecodeError as exc:
                torn = not raw.endswith(b"\n")
                cls = "consolidated_malformed_line" if consolidated else "malformed_line"
                report.add(cls, f"{'torn' if torn else 'malformed'} JSON line ({exc.msg})",
                           file=path, line=lineno)
                continue
            errs = schema_errors(path.name, row)
            if errs:
                cls = "consolidated_malformed_line" if consolidated else "schema_violation"
                report.add(cls, "; ".join(errs), file=path, line=lineno,
                           prompt_id=row.get("prompt_id") if isinstance(row, dict) else None)
                continue
            rows.append((lineno, row))
    return rows


def validate(root: Path, *, expected_prompt_ids: set[str] | None = None) -> dict[str, Any]:
    """Check a run's artifacts; write and return ``consolidated/validation_report.json``."""
    root = Path(root)
    report = _Report(root)
    manifest = load_manifest(root) or {}
    k = int(manifest.get("k_samples", 0))
    fmt = manifest.get("storage_format", "npy")

    for wdir in layout.worker_dirs(root):
        for name in SCHEMAS:
            _scan(wdir / name, report, consolidated=False)

    out = layout.consolidated_dir(root)
    counts: dict[str, Any] = {}
    if not (out / layout.PROMPT_INDEX).exists():
        report.add("not_consolidated", "no consolidated/prompt_index.jsonl", file=None)
    else:
        counts = _check_consolidated(out, report, k=k, fmt=fmt,
                                     expected_prompt_ids=expected_prompt_ids)

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
    tmp = out / "validation_report.json.partial"
    tmp.write_text(json.dumps(body, indent=2))
    os.replace(tmp, out / "validation_report.json")
    return body


def _check_consolidated(out: Path, report: _Report, *, k: int, fmt: str,
                        expected_prompt_ids: set[str] | None) -> dict[str, Any]:
    prompts = _scan(out / layout.PROMPT_INDEX, report, consolidated=True)
    gens = _scan(out / layout.GENERATIONS, report, consolidated=True)
    acts = _scan(out / layout.ACTIVATION_INDEX, report, consolidated=True)

    prompt_lines: dict[str, list[int]] = defaultdict(list)
    for line, row in prompts:
        prompt_lines[row["prompt_id"]].append(line)
        if row.get("label") is None:
            report.add("missing_label", "prompt has no label", file=out / layout.PROMPT_INDEX,
                       line=line, prompt_id=row["prompt_id"])
    for pid, lines in prompt_lines.items():
        if len(lines) > 1:
            report.add("duplicate_id", f"prompt_id repeated on lines {lines}",
                       file=out / layout.PROMPT_INDEX, line=lines[1], prompt_id=pid)

    samples: dict[str, set[int]] = defaultdict(set)
    gen_lines: dict[tuple[str, int], list[int]] = defaultdict(list)
    for line, row in gens:
        gen_lines[(row["prompt_id"], row["sample_id"])].append(line)
        samples[row["prompt_id"]].add(row["sample_id"])
    for (pid, sid), lines in gen_lines.items():
        if len(lines) > 1:
            report.add("duplicate_id", f"generation ({pid}, {sid}) repeated on lines {lines}",
                       file=out / layout.GENERATIONS, line=lines[1], prompt_id=pid)
    for pid in prompt_lines:
        have = samples.get(pid, set())
        if len(have) < k + 1:
            report.add("missing_samples", f"{len(have)} of {k + 1} generations",
                       file=out / layout.PROMPT_INDEX, line=prompt_lines[pid][0], prompt_id=pid)
    if expected_prompt_ids is not None:
        missing = sorted(expected_prompt_ids - set(prompt_lines))
        for pid in missing:
            report.add("incomplete_prompts", "prompt of the task not completed", prompt_id=pid)

    act_lines: dict[str, list[int]] = defaultdict(list)
    act_rows = {}
    for line, row in acts:
        act_lines[row["activation_key"]].append(line)
        act_rows[row["activation_key"]] = (line, row)
        if (row["prompt_id"], row["sample_id"]) not in gen_lines:
            report.add("orphaned_activation", "activation without a generation",
                       file=out / layout.ACTIVATION_INDEX, line=line, prompt_id=row["prompt_id"])
    for key, lines in act_lines.items():
        if len(lines) > 1:
            report.add("duplicate_id", f"activation_key {key} repeated on lines {lines}",
                       file=out / layout.ACTIVATION_INDEX, line=lines[1])
    for line, row in gens:
        key = f"{row['prompt_id']}_{row['sample_id']}"
        if key not in act_rows:
            report.add("missing_activation", "generation has no activations (capture failed?)",
                       file=out / layout.GENERATIONS, line=line, prompt_id=row["prompt_id"])

    if fmt == "npy":
        _check_npy_files(out, act_rows, report)
    else:
        _check_store(out, act_rows, report)
    return {"prompts": len(prompt_lines), "generations": len(gen_lines),
            "activations": len(act_rows)}


def _check_npy_files(out: Path, act_rows: dict[str, tuple[int, dict]], report: _Report) -> None:
    listed = set()
    for key, (line, row) in act_rows.items():
        path = out / row["file_path"]
        listed.add(path.name)
        if not path.exists():
            report.add("missing_activation_file", f"{row['file_path']} does not exist",
                       file=out / layout.ACTIVATION_INDEX, line=line, prompt_id=row["prompt_id"])
            continue
        try:
            arr = np.load(path, mmap_mode="r")
        except (ValueError, OSError) as exc:
            report.add("activation_mismatch", f"{row['file_path']} unreadable: {exc}",
                       file=out / layout.ACTIVATION_INDEX, line=line, prompt_id=row["prompt_id"])
            continue
        if list(arr.shape) != row["shape"] or arr.dtype.name != row["dtype"]:
            report.add("activation_mismatch",
                       f"{row['file_path']} is {list(arr.shape)} {arr.dtype.name}, index says "
                       f"{row['shape']} {row['dtype']}", file=out / layout.ACTIVATION_INDEX,
                       line=line, prompt_id=row["prompt_id"])
    act_dir = out / "activations"
    if act_dir.exists():
        for path in act_dir.glob("*.npy"):
            if path.name not in listed:
                report.add("orphaned_activation", "activation file not in the index",
                           file=path)


def _check_store(out: Path, act_rows: dict[str, tuple[int, dict]], report: _Report) -> None:
    try:
        reader = storage.open_store(out / "activations")
    except (storage.StorageError, OSError, ValueError) as exc:
        report.add("missing_activation_file", f"activation store unreadable: {exc}",
                   file=out / "activations")
        return
    try:
        keys = {k: i for i, k in enumerate(reader.keys())}
        for key, (line, row) in act_rows.items():
            i = keys.get(key)
            if i is None:
                report.add("missing_activation_file", f"{key} not in the activation store",
                           file=out / layout.ACTIVATION_INDEX, line=line,
                           prompt_id=row["prompt_id"])
            elif reader.seq_len(i) != row["shape"][1]:
                report.add("activation_mismatch",
                           f"{key}: store holds {reader.seq_len(i)} rows, index says "
                           f"{row['shape'][1]}", file=out / layout.ACTIVATION_INDEX, line=line,
                           prompt_id=row["prompt_id"])
    finally:
        reader.close()


def format_report(report: dict[str, Any], limit: int = 10) -> str:
    """Short terminal summary: counts per class, a few examples, the repair commands."""
    lines = [f"validation {'OK' if report['ok'] else 'FAILED'}: {report['counts']}"]
    for cls, n in sorted(report["problem_counts"].items()):
        lines.append(f"  {cls}: {n}  → repair: {report['repair'][cls]}")
        for p in [p for p in report["problems"] if p["class"] == cls][:3]:
            where = f"{p['file']}:{p['line']}" if p.get("line") else (p.get("file") or "")
            lines.append(f"      {where} {p.get('prompt_id') or ''} {p['message']}".rstrip())
    lines.append(f"report: {report['artifact_root']}/consolidated/validation_report.json")
    return "\n".join(lines)

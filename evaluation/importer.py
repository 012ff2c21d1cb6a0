"""``python -m orchestrator import``: answers produced elsewhere, as a run root ``evaluate`` scores.

Input: a JSONL file, one question per line (docs/formats/import-jsonl.md). Output: an artifact
root holding ``run_manifest.json`` (``"imported": true``), ``consolidated/prompt_index.jsonl``
and the method exports ``consolidated/exports/*.jsonl`` (docs/exports.md) that the text and
logprob methods read; no activations, so the probes and EigenScore are listed as skipped. A bad
line stops the import with one line naming ``file:line`` and the field.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any

from hallulog.contracts import layout
from hallulog.contracts.answer_match import alias_match_label
from hallulog.contracts.errors import HallulogError
from hallulog.contracts.jsonl import scan_lines
from hallulog.evaluation.data import EvaluationInputError

__all__ = ["add_import_parser", "run_import", "import_jsonl"]


def _fail(path: Path, lineno: int, msg: str):
    raise EvaluationInputError(f"{path}:{lineno}: {msg}")


def _answer(path, lineno, i, a) -> dict[str, Any]:
    where = f"answers[{i}]"
    if isinstance(a, str):
        return {"text": a}
    if not isinstance(a, dict) or not isinstance(a.get("text"), str):
        _fail(path, lineno, f"{where} must be a string or an object with a string 'text'")
    out = {"text": a["text"]}
    lps = a.get("token_logprobs")
    if lps is not None:
        if (
            not isinstance(lps, list)
            or not lps
            or not all(
                isinstance(x, (int, float))
                and not isinstance(x, bool)
                and math.isfinite(x)
                and x <= 0
                for x in lps
            )
        ):
            _fail(
                path,
                lineno,
                f"{where}.token_logprobs must be a non-empty list of finite numbers <= 0",
            )
        out["token_logprobs"] = [float(x) for x in lps]
    for key in ("tokens", "top_logprobs", "token_logits"):
        v = a.get(key)
        if v is None:
            continue
        if lps is None or not isinstance(v, list) or len(v) != len(lps):
            _fail(
                path,
                lineno,
                f"{where}.{key} needs token_logprobs and one entry per token ({len(lps or [])})",
            )
        if key == "top_logprobs" and not all(
            isinstance(t, list)
            and all(
                isinstance(e, dict)
                and isinstance(e.get("token"), str)
                and isinstance(e.get("logprob"), (int, float))
                for e in t
            )
            for t in v
        ):
            _fail(
                path,
                lineno,
                f"{where}.top_logprobs: each token's entry is a list of "
                '{"token": str, "logprob": number}',
            )
        out[key] = v
    return out


def _parse(path: Path, lineno: int, row: Any) -> dict[str, Any]:
    if not isinstance(row, dict):
        _fail(path, lineno, "each line must be a JSON object")
    q = row.get("question")
    if not isinstance(q, str) or not q.strip():
        _fail(path, lineno, "'question' (a non-empty string) is missing")
    ref = row.get("reference")
    refs = [ref] if isinstance(ref, str) else ref
    if refs is not None and not (isinstance(refs, list) and all(isinstance(r, str) for r in refs)):
        _fail(path, lineno, "'reference' must be a string or a list of strings (aliases)")
    if "answers" in row:
        answers = row["answers"]
        if not isinstance(answers, list) or not answers:
            _fail(
                path,
                lineno,
                "'answers' must be a non-empty list (the first is the primary "
                "answer, the rest its samples)",
            )
    elif "answer" in row:
        answers = [row["answer"]]
    else:
        _fail(path, lineno, "'answer' or 'answers' is missing")
    answers = [_answer(path, lineno, i, a) for i, a in enumerate(answers)]
    label = row.get("label")
    if label is not None and label not in (0, 1):
        _fail(path, lineno, "'label' must be 0 (correct), 1 (hallucinated) or absent")
    if label is None and refs:
        label = alias_match_label(answers[0]["text"], refs)
    pid = row.get("id")
    if pid is not None and not isinstance(pid, (str, int)):
        _fail(path, lineno, "'id' must be a string or an integer")
    pid = str(pid) if pid is not None else hashlib.sha256(q.encode()).hexdigest()[:16]
    return {
        "prompt_id": pid,
        "question": q,
        "references": refs or [],
        "answers": answers,
        "label": label,
    }


def _sample(a: dict, sid: int, label) -> dict:
    lps = a.get("token_logprobs")
    out = {
        "sample_id": sid,
        "text": a["text"],
        "label": label if sid == 0 else None,
        "token_logprobs": lps or [],
    }
    if lps:
        out.update(
            sum_logprob=float(sum(lps)),
            mean_logprob=float(sum(lps) / len(lps)),
            num_tokens=len(lps),
        )
    return out


def import_jsonl(src: Path | str, root: Path | str, *, model: str | None = None) -> dict:
    """Write ``root`` from ``src``; returns counts. Refuses a root that already has a run."""
    src, root = Path(src), Path(root)
    if not src.is_file():
        raise EvaluationInputError(f"{src}: no such file")
    if layout.consolidated_dir(root).exists() or (root / layout.MANIFEST).exists():
        raise EvaluationInputError(f"{root}: already holds a run; import into a new directory")
    rows, seen = [], {}
    for lineno, value, problem in scan_lines(src):
        if problem:
            _fail(src, lineno, problem)
        r = _parse(src, lineno, value)
        if r["prompt_id"] in seen:
            _fail(src, lineno, f"id {r['prompt_id']!r} repeats line {seen[r['prompt_id']]}")
        seen[r["prompt_id"]] = lineno
        rows.append(r)
    if not rows:
        raise EvaluationInputError(f"{src}: no questions")
    ex = layout.exports_dir(root)
    ex.mkdir(parents=True)
    k = max(len(r["answers"]) - 1 for r in rows)
    has_logits = all("token_logits" in a for r in rows for a in r["answers"])
    lp_f, sc_f, se_f, en_f = (
        layout.LOGPROB_INPUTS,
        layout.SELFCHECK_SAMPLES,
        layout.SEMANTIC_ENTROPY_INPUTS,
        layout.SEMANTIC_ENERGY_INPUTS,
    )
    files = {n: open(ex / n, "w", encoding="utf-8") for n in (lp_f, sc_f, se_f, en_f)}
    try:
        with open(layout.consolidated_dir(root) / layout.PROMPT_INDEX, "w", encoding="utf-8") as pi:
            for r in rows:
                base = {
                    "prompt_id": r["prompt_id"],
                    "label": r["label"],
                    "label_grader": "import",
                    "question": r["question"],
                    "prompt": r["question"],
                    "sample_ids": list(range(len(r["answers"]))),
                }
                prim, samples = r["answers"][0], r["answers"][1:]
                pi.write(
                    json.dumps(
                        {
                            "prompt_id": r["prompt_id"],
                            "prompt": r["question"],
                            "reference_answer": (r["references"] or [None])[0],
                            "reference": {"aliases": r["references"]},
                            "label": r["label"],
                        }
                    )
                    + "\n"
                )
                lps = prim.get("token_logprobs") or []
                toks = prim.get("tokens") or [None] * len(lps)
                tops = prim.get("top_logprobs") or [[] for _ in lps]
                files[lp_f].write(
                    json.dumps(
                        {
                            **base,
                            "sample_id": 0,
                            "text": prim["text"],
                            "tokens": toks,
                            "token_logprobs": lps,
                            "top_logprobs": tops,
                        }
                    )
                    + "\n"
                )
                files[sc_f].write(
                    json.dumps(
                        {
                            **base,
                            "primary": {"sample_id": 0, "text": prim["text"]},
                            "samples": [
                                {"sample_id": i, "text": a["text"]}
                                for i, a in enumerate(samples, start=1)
                            ],
                        }
                    )
                    + "\n"
                )
                files[se_f].write(
                    json.dumps(
                        {
                            **base,
                            "primary": _sample(prim, 0, r["label"]),
                            "samples": [
                                _sample(a, i, None) for i, a in enumerate(samples, start=1)
                            ],
                        }
                    )
                    + "\n"
                )
                src_kind = "raw_logits" if has_logits else "logprobs_only"
                files[en_f].write(
                    json.dumps(
                        {
                            **base,
                            "logit_source": src_kind,
                            "samples": [
                                {
                                    "sample_id": i,
                                    "text": a["text"],
                                    "token_logits": a.get("token_logits"),
                                    "token_logprobs": a.get("token_logprobs") or [],
                                    "logit_source": src_kind,
                                }
                                for i, a in enumerate(r["answers"])
                            ],
                        }
                    )
                    + "\n"
                )
    finally:
        for f in files.values():
            f.close()
    counts = {
        "prompts": len(rows),
        "labelled": sum(r["label"] in (0, 1) for r in rows),
        "k_samples": k,
        "with_logprobs": sum(bool(r["answers"][0].get("token_logprobs")) for r in rows),
    }
    (root / layout.MANIFEST).write_text(
        json.dumps(
            {
                "imported": True,
                "source": str(src),
                "model": model or "imported",
                "dataset": src.stem,
                "split": None,
                "k_samples": k,
                "logging_profile": "import",
                "sequence_mode": None,
                "storage_format": None,
                "import_counts": counts,
            },
            indent=2,
        )
        + "\n"
    )
    return counts


def add_import_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``import`` to the CLI's subparsers."""
    p = subparsers.add_parser(
        "import",
        help="Turn a JSONL of questions, references and answers into a run root that "
        "evaluate scores.",
        description="Reads one question per line: question, reference(s), answer(s) (the first "
        "is the primary answer, the rest its samples) and optional token logprobs "
        "(docs/formats/import-jsonl.md); writes run_manifest.json and "
        "consolidated/exports/ under --artifact-root. No activations: the text and "
        "logprob methods are scored, the probes are skipped.",
    )
    p.add_argument("jsonl", type=Path, help="The JSONL file to import.")
    p.add_argument(
        "--artifact-root", type=Path, required=True, help="A new directory for the imported run."
    )
    p.add_argument("--model", help="The model that wrote the answers (recorded in the manifest).")
    return p


def run_import(args: argparse.Namespace) -> int:
    """The ``import`` subcommand; 0 on success, 1 with a one-line message on bad input."""
    try:
        counts = import_jsonl(args.jsonl, args.artifact_root, model=getattr(args, "model", None))
    except HallulogError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(
        f"imported {counts['prompts']} questions ({counts['labelled']} labelled, "
        f"{counts['with_logprobs']} with token logprobs, K = {counts['k_samples']}) into "
        f"{args.artifact_root}; score them with `python -m orchestrator evaluate "
        f"--artifact-root {args.artifact_root}`"
    )
    return 0

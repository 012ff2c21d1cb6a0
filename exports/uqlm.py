"""``hallulog export uqlm ROOT DST``: what UQLM's scorers take, from a finished run.

UQLM's ``WhiteBoxUQ.score`` and ``BlackBoxUQ.score`` accept precomputed responses: the original
response per prompt, its token logprobs in the OpenAI chat format (``logprobs_results``: per
token ``{"token", "logprob", "top_logprobs": [{"token", "logprob"}, ...]}``), the sampled
responses and their logprobs. This export writes them, one row per prompt, from
``consolidated/`` (format: docs/formats/uqlm.md; ``load_uqlm`` gives the keyword arguments):

    rows = load_uqlm(DST)
    WhiteBoxUQ(scorers=[...], top_k_logprobs=rows["top_k"]).score(
        logprobs_results=rows["logprobs_results"], prompts=rows["prompts"],
        responses=rows["responses"], sampled_responses=rows["sampled_responses"],
        sampled_logprobs_results=rows["sampled_logprobs_results"])

``top_k`` (the number of alternatives stored per token) must be given to ``WhiteBoxUQ`` as
``top_k_logprobs``: its top-logprob scorers count a token only when it has exactly that many.
Streams ``consolidated/`` one prompt group at a time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hallulog.contracts import layout
from hallulog.contracts.jsonl import encode_line, iter_rows, read_document
from hallulog.contracts.reasoning import answer_view
from hallulog.exports._export_dir import staged_dir
from hallulog.exports.methods import iter_prompt_groups
from hallulog.storage.errors import StorageError

__all__ = ["export_uqlm", "load_uqlm", "ROWS_FILE", "MANIFEST_FILE", "ROW_FIELDS"]

ROWS_FILE = "uqlm.jsonl"
MANIFEST_FILE = "manifest.json"
FORMAT = "hallulog-uqlm"
VERSION = 1
ROW_FIELDS = (
    "prompt_id",
    "label",
    "prompt",
    "response",
    "logprobs",
    "sampled_responses",
    "sampled_logprobs",
)


def _logprobs(gen: dict[str, Any]) -> list[dict[str, Any]]:
    """The OpenAI chat ``logprobs.content`` of one generation (UQLM's ``logprobs_result``)."""
    return [
        {
            "token": t.get("token"),
            "logprob": t.get("logprob"),
            "top_logprobs": [
                {"token": a.get("token"), "logprob": a.get("logprob")}
                for a in t.get("top_logprobs") or []
            ],
        }
        for t in gen.get("logprobs") or []
    ]


def export_uqlm(root: str | Path, dst: str | Path) -> dict[str, Any]:
    """Write ``DST/uqlm.jsonl`` and ``DST/manifest.json``; returns the manifest."""
    root = Path(root)
    if not (layout.consolidated_dir(root) / layout.GENERATIONS).is_file():
        raise StorageError(
            "src: no consolidated/generations.jsonl; run `hallulog consolidate` first", str(root)
        )
    n, top_k = 0, 0
    with staged_dir(dst) as tmp:
        with open(os.path.join(tmp, ROWS_FILE), "wb") as f:
            for prompt, gens, _ in iter_prompt_groups(root):
                if prompt is None or not gens or gens[0]["sample_id"] != 0:
                    continue
                gens = [answer_view(g) for g in gens]  # the answers, reasoning left out
                primary, samples = gens[0], gens[1:]
                row = {
                    "prompt_id": prompt["prompt_id"],
                    "label": prompt.get("label"),
                    "prompt": prompt.get("prompt") or (prompt.get("meta") or {}).get("question"),
                    "response": primary["text"],
                    "logprobs": _logprobs(primary),
                    "sampled_responses": [g["text"] for g in samples],
                    "sampled_logprobs": [_logprobs(g) for g in samples],
                }
                for t in row["logprobs"]:
                    top_k = max(top_k, len(t["top_logprobs"]))
                f.write(encode_line(row))
                n += 1
            f.flush()
            os.fsync(f.fileno())
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "source": str(root.resolve()),
            "prompts": n,
            "top_k": top_k,
            "fields": list(ROW_FIELDS),
            "score_orientation": "UQLM scores are confidences: higher = more likely correct",
        }
        with open(os.path.join(tmp, MANIFEST_FILE), "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2)
    return manifest


def load_uqlm(dst: str | Path) -> dict[str, Any]:
    """The export as the keyword arguments of UQLM's ``score`` (``prompts``, ``responses``,
    ``logprobs_results``, ``sampled_responses``, ``sampled_logprobs_results``), plus
    ``prompt_ids``, ``labels`` and ``top_k``."""
    dst = Path(dst)
    manifest = read_document(dst / MANIFEST_FILE, "uqlm export manifest")
    out: dict[str, list] = {
        k: []
        for k in (
            "prompt_ids",
            "labels",
            "prompts",
            "responses",
            "logprobs_results",
            "sampled_responses",
            "sampled_logprobs_results",
        )
    }
    for row in iter_rows(dst / ROWS_FILE):
        out["prompt_ids"].append(row["prompt_id"])
        out["labels"].append(row["label"])
        out["prompts"].append(row["prompt"])
        out["responses"].append(row["response"])
        out["logprobs_results"].append(row["logprobs"])
        out["sampled_responses"].append(row["sampled_responses"])
        out["sampled_logprobs_results"].append(row["sampled_logprobs"])
    return {**out, "top_k": manifest["top_k"]}

"""``hallulog export lm-polygraph ROOT DST``: a run's statistics under LM-Polygraph's names.

LM-Polygraph's estimators are functions of a dict of *statistics* (``stats["greedy_log_likelihoods"]``,
``stats["sample_texts"]``, ...) that its calculators compute by generating again. This export
writes those statistics from a finished run instead, one row per prompt, so the estimators run
on the stored answers (format: docs/formats/lm-polygraph.md; ``load_stats`` gives the dict).

Approximations, recorded in ``manifest.json``: ``entropy`` is the entropy of each token's stored
top-k renormalised (LM-Polygraph's ``EntropyCalculator`` on a distribution that is zero outside
the top-k); ``embeddings_decoder`` is the mean of the primary's stored rows at one layer (the
response rows in the default profile; LM-Polygraph averages every prompt and answer token of the
last layer); ``sample_embeddings`` the last stored row of each sample at the middle stored layer
(LM-Polygraph: the middle layer, the last generated token); ``attention_all`` holds, of
LM-Polygraph's gen-only attention maps, the two diagonals the attention summaries give
(exports/lm_polygraph_attention.py: what ``RAUQ`` reads), NaN elsewhere.

Streams ``consolidated/`` one prompt group at a time; the two embedding arrays are ``.npy``
files written through a memory map (their rows in ``stats.jsonl`` order).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from hallulog.contracts import layout
from hallulog.contracts.jsonl import encode_line, iter_rows, read_document
from hallulog.contracts.reasoning import answer_view
from hallulog.contracts.run_manifest import RunManifest
from hallulog.exports._export_dir import staged_dir
from hallulog.exports.lm_polygraph_attention import (
    ATTENTION_FILE,
    KEPT,
    AttentionAll,
    PrimaryAttention,
)
from hallulog.exports.methods import iter_prompt_groups
from hallulog.storage.errors import StorageError

__all__ = [
    "export_lm_polygraph",
    "load_stats",
    "topk_entropy",
    "STATS_FILE",
    "MANIFEST_FILE",
    "STAT_FIELDS",
]

STATS_FILE = "stats.jsonl"
MANIFEST_FILE = "manifest.json"
EMBEDDINGS_FILE = "embeddings_decoder.npy"
SAMPLE_EMBEDDINGS_FILE = "sample_embeddings.npy"
FORMAT = "hallulog-lm-polygraph"
VERSION = 1

#: the per-prompt statistics of stats.jsonl, in LM-Polygraph's names (hallulog's own: prompt_id,
#: label, greedy_top_logprobs)
STAT_FIELDS = (
    "input_texts",
    "target_texts",
    "greedy_texts",
    "greedy_tokens",
    "greedy_log_likelihoods",
    "entropy",
    "sample_texts",
    "sample_tokens",
    "sample_log_probs",
    "sample_log_likelihoods",
)


def topk_entropy(top: list[dict] | None) -> float | None:
    """-sum p log p of one token's top-k logprobs renormalised over the k; None without them."""
    lps = [t["logprob"] for t in top or [] if t.get("logprob") is not None]
    if not lps:
        return None
    lp = np.asarray(lps, np.float64)
    lp = lp - np.logaddexp.reduce(lp)
    return float(-(np.exp(lp) * lp).sum())


def _token_logprobs(gen: dict[str, Any]) -> list[float | None]:
    return [t.get("logprob") for t in gen.get("logprobs") or []]


def _sum(lps: list[float | None]) -> float | None:
    return float(sum(lps)) if lps and None not in lps else None


def _row(prompt: dict[str, Any], gens: list[dict[str, Any]]) -> dict[str, Any]:
    primary, samples = gens[0], gens[1:]
    ref = prompt.get("reference")
    target = prompt.get("reference_answer")
    if target is None and isinstance(ref, dict):
        target = ref.get("value")
    return {
        "prompt_id": prompt["prompt_id"],
        "label": prompt.get("label"),
        "input_texts": prompt.get("prompt") or (prompt.get("meta") or {}).get("question"),
        "target_texts": target,
        "greedy_texts": primary["text"],
        "greedy_tokens": primary.get("token_ids") or [],
        "greedy_log_likelihoods": _token_logprobs(primary),
        "entropy": [topk_entropy(t.get("top_logprobs")) for t in primary.get("logprobs") or []],
        "greedy_top_logprobs": [t.get("top_logprobs") for t in primary.get("logprobs") or []],
        "sample_texts": [g["text"] for g in samples],
        "sample_tokens": [g.get("token_ids") or [] for g in samples],
        "sample_log_probs": [_sum(_token_logprobs(g)) for g in samples],
        "sample_log_likelihoods": [_token_logprobs(g) for g in samples],
        "attention_rows": None,
    }


class _Attention:
    """``attention_all.npy``: the primaries' stored ``self`` and ``previous``, row by row."""

    def __init__(self, source: PrimaryAttention, tmp: str) -> None:
        self.source, self.at = source, 0
        shape = (source.rows, source.layers, source.heads, len(KEPT))
        path = os.path.join(tmp, ATTENTION_FILE)
        self.values = np.lib.format.open_memmap(path, "w+", np.float16, shape)
        self.values[:] = np.nan

    def add(self, row: dict[str, Any]) -> None:
        """Set ``row["attention_rows"]`` where the primary's summaries cover its tokens (not a
        reasoning model's answer, whose tokens start after its reasoning)."""
        block = self.source.read(row["prompt_id"])
        if block is None or len(block) != len(row["greedy_tokens"]) or not len(block):
            return
        self.values[self.at : self.at + len(block)] = block
        row["attention_rows"] = [self.at, self.at + len(block)]
        self.at += len(block)

    def close(self) -> None:
        self.values.flush()
        del self.values
        self.source.close()


class _Hidden:
    """The two embedding arrays, filled prompt by prompt from the store."""

    def __init__(self, root: Path, n: int, k: int, layer: int | None, tmp: str):
        from hallulog.storage import open_store

        self.reader = open_store(layout.consolidated_dir(root))
        ids = [int(x) for x in self.reader.layer_ids]
        if layer is None:
            layer = ids[-1]
        if layer not in ids:
            self.reader.close()
            raise StorageError(f"layer: the store holds layers {ids}, not {layer}", str(root))
        self.layer, self.li = layer, ids.index(layer)
        self.mid = len(ids) // 2
        self.middle_layer = ids[self.mid]
        from hallulog.storage.dtypes import BFLOAT16, to_float32

        self.wide = to_float32 if self.reader.dtype == BFLOAT16 else (lambda a: a)
        h = self.reader.hidden_size
        fmt = np.lib.format
        self.emb = fmt.open_memmap(os.path.join(tmp, EMBEDDINGS_FILE), "w+", np.float32, (n, h))
        self.samples = fmt.open_memmap(
            os.path.join(tmp, SAMPLE_EMBEDDINGS_FILE), "w+", np.float32, (n, k, h)
        )
        self.emb[:] = np.nan
        self.samples[:] = np.nan

    def _index(self, key: str | None) -> int:
        try:
            return self.reader.index_of(key) if key else -1
        except KeyError:
            return -1

    def add(self, i: int, acts: list[dict[str, Any]]) -> None:
        by_sample = {a.get("sample_id"): a.get("activation_key") for a in acts}
        j = self._index(by_sample.get(0))
        if j >= 0:
            rows = self.reader.read(j, self.li)
            if len(rows):
                self.emb[i] = np.asarray(self.wide(rows), np.float32).mean(0)
        for s in range(self.samples.shape[1]):
            j = self._index(by_sample.get(s + 1))
            if j >= 0:
                rows = self.reader.read(j, self.mid)
                if len(rows):
                    self.samples[i, s] = self.wide(rows[-1])

    def close(self) -> None:
        for a in (self.emb, self.samples):
            a.flush()
        del self.emb, self.samples
        self.reader.close()


def _count(root: Path) -> tuple[int, int]:
    """(an upper bound on the prompts: the rows of prompt_index.jsonl; K of the run manifest)."""
    n = sum(1 for _ in iter_rows(layout.consolidated_dir(root) / layout.PROMPT_INDEX))
    manifest = RunManifest.load(root)
    k = int((manifest.to_dict() if manifest is not None else {}).get("k_samples") or 0)
    if not k:  # no manifest (a root assembled by hand): the first prompt group's samples
        first = next(iter_prompt_groups(root), None)
        k = len(first[1]) - 1 if first else 0
    return n, k


def export_lm_polygraph(
    root: str | Path,
    dst: str | Path,
    *,
    layer: int | None = None,
    hidden: bool = True,
    attention: bool = True,
) -> dict[str, Any]:
    """Write ``DST/stats.jsonl`` (+ ``embeddings_decoder.npy``, ``sample_embeddings.npy`` with
    ``hidden`` and an activation store; ``attention_all.npy`` with ``attention`` and the run's
    attention summaries) and ``DST/manifest.json``; returns the manifest."""
    root = Path(root)
    cons = layout.consolidated_dir(root)
    if not (cons / layout.GENERATIONS).is_file():
        raise StorageError(
            "src: no consolidated/generations.jsonl; run `hallulog consolidate` first", str(root)
        )
    n, k = _count(root)
    has_store = (cons / layout.ACTIVATION_INDEX).is_file() and layout.activations_dir(cons).exists()
    with staged_dir(dst) as tmp:
        hid = _Hidden(root, n, k, layer, tmp) if hidden and has_store and n else None
        source = PrimaryAttention(root) if attention else None
        att = _Attention(source, tmp) if source else None
        i = 0
        try:
            with open(os.path.join(tmp, STATS_FILE), "wb") as f:
                for prompt, gens, acts in iter_prompt_groups(root):
                    if prompt is None or not gens or gens[0]["sample_id"] != 0:
                        continue
                    row = _row(prompt, [answer_view(g) for g in gens])
                    if att is not None:
                        att.add(row)
                    f.write(encode_line(row))
                    if hid is not None:
                        hid.add(i, acts)
                    i += 1
                f.flush()
                os.fsync(f.fileno())
        finally:
            if hid is not None:
                hid.close()
            if att is not None:
                att.close()
        arrays: dict[str, Any] = {}
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "source": str(root.resolve()),
            "prompts": i,
            "k_samples": k,
            "stats": list(STAT_FIELDS),
            "arrays": arrays,
            "approximations": {
                "entropy": "entropy of each token's stored top-k logprobs renormalised over "
                "the k (the full-vocabulary entropy is not stored)",
                "embeddings_decoder": "mean over the stored rows (response rows in the default "
                "profile), not over every prompt and answer token",
            },
        }
        if hid is not None:
            arrays.update(
                {
                    "embeddings_decoder": {
                        "file": EMBEDDINGS_FILE,
                        "layer": hid.layer,
                        "rows": "mean of the primary's stored rows at this layer",
                    },
                    "sample_embeddings": {
                        "file": SAMPLE_EMBEDDINGS_FILE,
                        "layer": hid.middle_layer,
                        "rows": "last stored row of each sample at the middle stored layer",
                    },
                }
            )
        if att is not None:
            arrays["attention_all"] = {
                "file": ATTENTION_FILE,
                "layers": source.layers,
                "heads": source.heads,
                "rows": "per token of each primary (stats.jsonl attention_rows), layer and "
                "head: attention_all[:, j, j-1] (self) and [:, j, j-2] (previous)",
            }
            manifest["approximations"]["attention_all"] = (
                "only the diagonals -1 and -2 of each answer's gen-only attention map are "
                "stored (float16, from an eager transformers pass over prompt + answer); the "
                "other entries below the diagonal load as NaN"
            )
        with open(os.path.join(tmp, MANIFEST_FILE), "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2)
    return manifest


#: the numeric fields whose nulls (a logprob that was not finite) load as NaN
_NUMERIC = ("greedy_log_likelihoods", "entropy", "sample_log_probs", "sample_log_likelihoods")


def _nan(v):
    if isinstance(v, list):
        return [_nan(x) for x in v]
    return np.nan if v is None else v


def load_stats(dst: str | Path) -> dict[str, Any]:
    """The export as LM-Polygraph's ``stats`` dict: every field of ``stats.jsonl`` as a list over
    prompts (a null logprob as NaN), plus ``embeddings_decoder`` and ``sample_embeddings`` arrays
    and ``attention_all`` (:class:`AttentionAll`) when written, and ``manifest``."""
    dst = Path(dst)
    manifest = read_document(dst / MANIFEST_FILE, "lm-polygraph export manifest")
    stats: dict[str, Any] = {}
    for row in iter_rows(dst / STATS_FILE):
        for key, v in row.items():
            stats.setdefault(key, []).append(_nan(v) if key in _NUMERIC else v)
    n = manifest["prompts"]
    for name, arr in manifest.get("arrays", {}).items():
        values = np.load(dst / arr["file"], mmap_mode="r")
        if name == "attention_all":  # built one answer at a time (AttentionAll)
            lengths = [len(t) for t in stats.get("greedy_tokens", [])]
            values = AttentionAll(values, stats.get("attention_rows", [None] * n), lengths)
        else:
            values = values[:n]
        stats[name] = values
    stats["manifest"] = manifest
    return stats

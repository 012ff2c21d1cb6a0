"""Alignment audit (``run --validate-only --deep``): stored activations vs recorded token ids.

Layer id 0 is the embedding output, so a stored layer-0 row *is* a row of the model's embedding
matrix (cast to the store dtype): the row at absolute position p must equal ``E[ids[p]]``,
where ``ids`` = ``prompt_token_ids`` (prompt_index.jsonl) + ``token_ids`` (generations.jsonl)
and p = ``row0_position + j``, or ``token_positions[j]`` in a run with ``--positions``
(docs/alignment.md). The audit reads the embedding matrix from
the model directory (no forward pass), checks every row of every stored activation, and names
the activation key, row and the token the row decodes to for every mismatch.

Every stored row of every layer also goes through the capture check
(``evaluation/row_audit.py``: all zeros, non-finite, repeated across different tokens), counted
per reason under ``capture_check``; ``ok`` needs both.

When layer 0 is not stored (profile ``light``), a sample of generations is recomputed with
transformers from the model directory (the embedded backend's model, on CPU) and the stored rows
of every stored layer below the last are compared with relative tolerance ``RECOMPUTE_RTOL``.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import time
from pathlib import Path

import numpy as np
from hallulog.contracts import layout
from hallulog.contracts.errors import ArtifactError
from hallulog.contracts.run_manifest import RunManifest
from hallulog.evaluation.data import EvaluationInputError, iter_jsonl
from hallulog.evaluation.row_audit import RowAudit, format_row_audit

__all__ = [
    "audit_alignment",
    "format_audit",
    "load_embedding_matrix",
    "RECOMPUTE_RTOL",
    "EXACT_RTOL",
]

log = logging.getLogger(__name__)

#: layer-0 rows: relative L2 error to E[token] allowed (exact equality expected; fp16 rounding
#: of a bf16 model's weights is the only legitimate difference)
EXACT_RTOL = 1e-3
#: recomputed rows: relative L2 error allowed (fp16 storage, batched vs single-sequence kernels)
RECOMPUTE_RTOL = 0.05
_MAX_LISTED = 50

_EMBED_KEYS = (
    "model.embed_tokens.weight",
    "embed_tokens.weight",
    "transformer.wte.weight",
    "wte.weight",
    "model.decoder.embed_tokens.weight",
    "lm_head.weight",
)


def _model_dir(root: Path, model_dir: Path | str | None) -> Path:
    if model_dir is not None:
        return Path(model_dir)
    man = RunManifest.path(root)
    manifest = RunManifest.load(root)
    path = manifest.model_path if manifest is not None else None
    if not path or not (Path(path) / "config.json").is_file():
        raise EvaluationInputError(
            f"{man}: no usable model_path (got {path!r}); the audit reads the model's embedding "
            "matrix from the model directory: pass --model-dir or rerun so the manifest has it"
        )
    return Path(path)


def load_embedding_matrix(model_dir: Path | str) -> np.ndarray:
    """The token embedding matrix ``(vocab, hidden)`` as float32, from the safetensors files."""
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(os.fspath(model_dir), "*.safetensors")))
    if not files:
        raise EvaluationInputError(f"{model_dir}: no *.safetensors file holds the model weights")
    for key in _EMBED_KEYS:  # tied models keep only one of embed_tokens / lm_head
        for f in files:
            with safe_open(f, framework="pt") as st:
                if key in st.keys():
                    return st.get_tensor(key).float().numpy()
    raise EvaluationInputError(f"{model_dir}: no embedding matrix among {_EMBED_KEYS}")


def _prompt_ids(cons: Path) -> dict[str, np.ndarray]:
    out = {}
    path = cons / layout.PROMPT_INDEX
    for lineno, row in iter_jsonl(path):
        ids = row.get("prompt_token_ids")
        if ids is None:
            raise ArtifactError(f"{path}:{lineno}: no prompt_token_ids")
        out[row["prompt_id"]] = np.asarray(ids, np.int64)
    return out


def _act_index(cons: Path) -> dict[str, dict]:
    out = {}
    for _, row in iter_jsonl(cons / layout.ACTIVATION_INDEX):
        row0 = int(row.get("row0_position", 0))
        n = int(row.get("num_rows", (row.get("shape") or [0, 0])[1]))
        # row j sits at token_positions[j] (--positions runs), else at row0_position + j
        pos = row.get("token_positions")
        out[row["activation_key"]] = {
            "row0": row0,
            "num_rows": n,
            "prompt_rows": row.get("prompt_rows"),
            "positions": np.asarray(pos if pos is not None else range(row0, row0 + n), np.int64),
        }
    return out


def _iter_generations(cons: Path):
    for _, row in iter_jsonl(cons / layout.GENERATIONS):
        yield (
            row["prompt_id"],
            int(row["sample_id"]),
            np.asarray(row.get("token_ids") or [], np.int64),
        )


def audit_alignment(
    artifact_root: Path | str,
    *,
    model_dir: Path | str | None = None,
    sample: int = 8,
    seed: int = 0,
) -> dict:
    """Check every stored activation (layer 0 stored) or a sample (recompute); return a report
    ``{ok, mode, checked, rows_checked, mismatches: [{activation_key, ...}], ...}``."""
    t0 = time.monotonic()
    root = Path(artifact_root)
    cons = layout.consolidated_dir(root)
    if not cons.is_dir():
        raise EvaluationInputError(
            f"{root}: no consolidated/ directory; run `python -m "
            f"orchestrator run --artifact-root {root} --consolidate-only`"
        )
    from hallulog.storage import open_store

    reader = open_store(cons)
    acts = _act_index(cons)
    prompts = _prompt_ids(cons)
    mdir = _model_dir(root, model_dir)
    layer_ids = [int(x) for x in reader.layer_ids]
    mismatches: list[dict] = []
    checked = rows_checked = 0
    missing_in_store = []
    worst = 0.0
    if 0 in layer_ids:
        mode = "embedding"
        emb = load_embedding_matrix(mdir)
        if emb.shape[1] != reader.hidden_size:
            raise EvaluationInputError(
                f"{mdir}: embedding width {emb.shape[1]} differs from the "
                f"store's hidden size {reader.hidden_size}"
            )
        emb_s = emb.astype(reader.dtype).astype(np.float32)
        norms = np.linalg.norm(emb_s, axis=1) + 1e-12
        lpos = layer_ids.index(0)
        todo = None
    else:
        mode = "recompute"
        keys = sorted(acts, key=lambda k: hashlib.sha256(f"{seed}:{k}".encode()).hexdigest())
        todo = set(keys[:sample])
        model = _Recompute(mdir, layer_ids)
    rows_audit = RowAudit(layer_ids)
    for pid, sid, gen_ids in _iter_generations(cons):
        key = f"{pid}_{sid}"
        if key not in acts:
            continue
        a = acts[key]
        try:
            i = reader.index_of(key)
        except KeyError:
            missing_in_store.append(key)
            continue
        seq = np.concatenate([prompts.get(pid, np.zeros(0, np.int64)), gen_ids])
        at = a["positions"]
        expected = seq[at] if not len(at) or at[-1] < len(seq) else seq[:0]
        stored = reader.read_sample(i)  # every layer: the capture check reads every row
        rows_audit.add(key, stored, expected if len(expected) == stored.shape[1] else None)
        if todo is not None and key not in todo:
            continue
        meta = reader.meta(i)
        checked += 1
        if int(meta["seq_len"]) != a["num_rows"] or len(expected) != a["num_rows"]:
            mismatches.append(
                {
                    "activation_key": key,
                    "problem": "row count",
                    "stored_rows": int(meta["seq_len"]),
                    "index_rows": a["num_rows"],
                    "token_ids_available": int(len(expected)),
                }
            )
            continue
        if mode == "embedding":
            rows = stored[lpos].astype(np.float32)
            ref = emb_s[expected]
            err = np.linalg.norm(rows - ref, axis=1) / norms[expected]
            # a non-finite row (err NaN) is the capture check's, not a misalignment
            bad = np.flatnonzero(err > EXACT_RTOL)
            rows_checked += len(rows)
            finite = err[np.isfinite(err)]
            worst = max(worst, float(finite.max()) if len(finite) else 0.0)
            if len(bad):
                decoded = _decode(rows[bad], emb_s, norms)
                mismatches.append(
                    {
                        "activation_key": key,
                        "problem": "layer-0 rows are not the embeddings of the recorded token ids",
                        "rows": bad[:20].tolist(),
                        "num_bad_rows": int(len(bad)),
                        "positions": at[bad[:20]].tolist(),
                        "expected_token_ids": expected[bad[:20]].tolist(),
                        "decoded_token_ids": decoded[:20].tolist(),
                    }
                )
        else:
            err, layer = model.compare(reader, i, seq, at)
            rows_checked += a["num_rows"]
            worst = max(worst, err)
            if err > RECOMPUTE_RTOL:
                mismatches.append(
                    {
                        "activation_key": key,
                        "problem": "stored rows differ from the recomputed hidden states",
                        "max_rel_error": err,
                        "layer_id": layer,
                        "tolerance": RECOMPUTE_RTOL,
                    }
                )
    for key in missing_in_store:
        mismatches.append(
            {
                "activation_key": key,
                "problem": "in activation_index.jsonl but not in the activation store",
            }
        )
    reader.close()
    capture_check = rows_audit.report()
    return {
        "ok": not mismatches and capture_check["ok"],
        "aligned": not mismatches,
        "mode": mode,
        "model_dir": str(mdir),
        "layer_ids": layer_ids,
        "checked": checked,
        "rows_checked": rows_checked,
        "tolerance": EXACT_RTOL if mode == "embedding" else RECOMPUTE_RTOL,
        "max_rel_error": worst,
        "num_mismatches": len(mismatches),
        "mismatches": mismatches[:_MAX_LISTED],
        "capture_check": capture_check,
        "seconds": round(time.monotonic() - t0, 3),
    }


def _decode(rows: np.ndarray, emb: np.ndarray, norms: np.ndarray) -> np.ndarray:
    """Nearest embedding row (cosine) of each row: which token a misplaced row really is."""
    sims = (rows / (np.linalg.norm(rows, axis=1, keepdims=True) + 1e-12)) @ (emb / norms[:, None]).T
    return sims.argmax(1)


class _Recompute:
    """Hidden states of one sequence with transformers: ids 0..N as the capture defines them
    (embedding output, then each decoder layer's output before the final norm)."""

    def __init__(self, model_dir: Path, layer_ids: list[int]):
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.eval()
        self.layer_ids = layer_ids
        self.num_layers = self.model.config.num_hidden_layers

    def hidden(self, ids: np.ndarray) -> np.ndarray:
        torch = self.torch
        with torch.no_grad():
            out = self.model(torch.as_tensor(ids[None]), output_hidden_states=True)
        return torch.stack(out.hidden_states[: self.num_layers], 0)[:, 0].numpy()  # ids 0..N-1

    def compare(self, reader, i: int, seq: np.ndarray, positions: np.ndarray) -> tuple[float, int]:
        """Worst relative error of the stored rows (row j at ``positions[j]``) and its layer."""
        if not len(positions):
            return 0.0, -1
        hs = self.hidden(seq[: int(positions[-1]) + 1])
        worst, worst_layer = 0.0, -1
        for lpos, lid in enumerate(self.layer_ids):
            if lid >= self.num_layers:  # transformers' last entry is after the final norm
                continue
            stored = reader.read(i, lpos).astype(np.float32)
            ref = hs[lid, positions]
            err = float(
                (np.linalg.norm(stored - ref, axis=1) / (np.linalg.norm(ref, axis=1) + 1e-6)).max()
            )
            if err > worst:
                worst, worst_layer = err, lid
        return worst, worst_layer


def format_audit(result: dict) -> str:
    head = (
        f"alignment audit ({result['mode']}): {result['checked']} activations, "
        f"{result['rows_checked']} rows checked in {result['seconds']:.1f} s (max relative "
        f"error {result['max_rel_error']:.2g}, tolerance {result['tolerance']:g}): "
        + ("OK" if not result["num_mismatches"] else f"{result['num_mismatches']} MISALIGNED")
    )
    lines = [head]
    if "capture_check" in result:
        lines.append(format_row_audit(result["capture_check"]))
    for m in result["mismatches"][:10]:
        detail = {k: v for k, v in m.items() if k not in ("activation_key", "problem")}
        lines.append(f"  {m['activation_key']}: {m['problem']} {json.dumps(detail)}")
    return "\n".join(lines)

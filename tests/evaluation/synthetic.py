"""A small synthetic run written with the real storage writer, real JSONL and the real exports.

Token ids come from a fake vocabulary whose embedding matrix lives in a fake model directory
(``model.safetensors`` + ``config.json``), so layer-0 rows are exact embedding rows as in a real
capture. Higher layers carry a label-dependent direction, so the probes have something to find.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from hallulog.exports.methods import write_exports
from hallulog.storage import SampleMeta, open_writer
from hallulog.storage.dtypes import store_dtype
from safetensors.numpy import save_file

VOCAB, HIDDEN, LAYERS = 64, 16, (0, 1, 2, 3)
WORDS = ["paris", "london", "rome", "berlin", "madrid", "oslo", "vienna", "lisbon"]


def _pid(i: int, dataset: str = "synth") -> str:
    return hashlib.sha256(json.dumps([dataset, "dev", str(i)]).encode()).hexdigest()[:16]


def _jsonl(path: Path, rows) -> None:
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def make_run(
    root: Path,
    *,
    n: int = 40,
    k: int = 3,
    seed: int = 0,
    labels=None,
    layers=LAYERS,
    sequence_mode: str = "response",
    logits: bool = True,
    plant=None,
    dtype: str = "float16",
    dataset: str = "synth",
) -> Path:
    """Write ``root`` with ``consolidated/`` (+ exports) and a model dir; returns root.

    ``dtype``: the store's (float16, float32 or bfloat16).
    ``plant``: ``("shift", index)`` stores prompt ``index``'s primary rows one position late;
    ``("swap", i, j)`` stores the primaries of prompts i and j under each other's keys;
    ``("zeros", i)`` stores prompt i's primary as zeros (every layer), ``("nan0", i)`` with a NaN
    in hidden dimension 0 of every row and layer, ``("constant", i)`` with each layer's first
    row repeated in every row.
    ``dataset``: the prompt ids' dataset (runs of one dataset share prompt ids).
    """
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    model = root / "model"
    model.mkdir(exist_ok=True)
    emb = rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32)
    save_file({"model.embed_tokens.weight": emb}, str(model / "model.safetensors"))
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    direction = rng.standard_normal(HIDDEN).astype(np.float32)
    cons = root / "consolidated"
    cons.mkdir(exist_ok=True)
    labels = list(labels) if labels is not None else [i % 2 for i in range(n)]
    prompts, gens, index, acts = [], [], [], {}
    for i in range(n):
        pid, y = _pid(i, dataset), labels[i]
        p_ids = [1, 2] + rng.integers(10, VOCAB, 4).tolist() + [3]
        prompts.append(
            {
                "prompt_id": pid,
                "dataset_id": str(i),
                "prompt": f"Q{i}?",
                "reference_answer": WORDS[i % 8],
                "label": y,
                "label_grader": "alias_match",
                "meta": {"question": f"Q{i}?"},
                "prompt_token_ids": p_ids,
            }
        )
        for s in range(k + 1):
            # correct prompts answer consistently; hallucinated ones scatter over the words
            word = WORDS[i % 8] if (y == 0 or s == 0) else WORDS[rng.integers(0, 8)]
            r_ids = rng.integers(10, VOCAB, 3).tolist() + [0]
            conf = 2.0 if y == 0 else 0.5
            lps = (-rng.exponential(0.2 if y == 0 else 1.0, len(r_ids))).tolist()
            toks = [f" {word}" if t == 0 else f"t{r}" for t, r in enumerate(r_ids[:-1])] + [
                "<|im_end|>"
            ]
            gens.append(
                {
                    "prompt_id": pid,
                    "sample_id": s,
                    "role": "primary" if s == 0 else "sample",
                    "text": word.capitalize() + ".",
                    "finish_reason": "stop",
                    "token_ids": r_ids,
                    "logprobs": [
                        {
                            "token": t,
                            "logprob": lp,
                            "top_logprobs": [{"token": t, "logprob": lp}],
                            **({"logit": 10 * conf + lp} if logits else {}),
                        }
                        for t, lp in zip(toks, lps)
                    ],
                    "label": y if s == 0 else None,
                    "label_grader": "alias_match",
                }
            )
            seq = np.asarray(p_ids + r_ids)
            P, R = len(p_ids), len(r_ids)
            start, stop = {
                "response": (P - 1, P + R - 1),
                "last": (P + R - 2, P + R - 1),
                "all": (0, P + R - 1),
            }[sequence_mode]
            pos = np.arange(start, stop)
            key = f"{pid}_{s}"
            acts[key] = (seq, pos, y, P)
            index.append(
                {
                    "prompt_id": pid,
                    "sample_id": s,
                    "activation_key": key,
                    "layers": list(layers),
                    "sequence_mode": sequence_mode,
                    "capture_mode": "generation",
                    "prompt_token_count": P,
                    "response_token_count": R,
                    "row0_position": int(start),
                    "num_rows": int(stop - start),
                    "prompt_rows": int(max(0, min(stop, P) - start)),
                    "response_rows": int(stop - start - max(0, min(stop, P) - start)),
                    "shape": [len(layers), int(stop - start), HIDDEN],
                    "dtype": dtype,
                }
            )
    keys = list(acts)
    stored = {kk: acts[kk] for kk in keys}
    if plant and plant[0] == "shift":
        kk = f"{_pid(plant[1], dataset)}_0"
        seq, pos, y, P = acts[kk]
        stored[kk] = (seq, np.minimum(pos + 1, len(seq) - 1), y, P)
    if plant and plant[0] == "swap":
        a, b = f"{_pid(plant[1], dataset)}_0", f"{_pid(plant[2], dataset)}_0"
        stored[a], stored[b] = acts[b], acts[a]
    writer = open_writer("packed", cons, list(layers), HIDDEN, dtype)
    for kk in keys:
        seq, pos, y, P = stored[kk]
        rows = len(acts[kk][1])  # the index's row count
        pos = pos[:rows]
        base = emb[seq[pos]]
        out = np.empty((len(layers), rows, HIDDEN), np.float32)
        for li, lid in enumerate(layers):
            noise = rng.standard_normal((rows, HIDDEN)).astype(np.float32)
            out[li] = base if lid == 0 else base + lid * (y - 0.5) * direction + noise
        if plant and plant[0] in ("zeros", "nan0", "constant") and kk == f"{_pid(plant[1])}_0":
            if plant[0] == "zeros":
                out[:] = 0.0
            elif plant[0] == "nan0":
                out[:, :, 0] = np.nan
            else:
                out[:] = out[:, :1]
        pr = int(max(0, min(pos[-1] + 1, P) - pos[0]))
        writer.write(kk, out.astype(store_dtype(dtype)), SampleMeta(pr, rows - pr, y))
    writer.close()
    _jsonl(cons / "prompt_index.jsonl", prompts)
    _jsonl(cons / "generations.jsonl", gens)
    _jsonl(cons / "activation_index.jsonl", index)
    write_exports(root)
    (root / "run_manifest.json").write_text(
        json.dumps(
            {
                "model": "synthetic",
                "model_path": str(model),
                "dataset": dataset,
                "split": "dev",
                "k_samples": k,
                "logging_profile": "test",
                "sequence_mode": sequence_mode,
                "storage_format": "packed",
            }
        )
    )
    return root

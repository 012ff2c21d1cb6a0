"""A finished run written directly with pyarrow, for ``hallulog view``'s bench and fast tests:
``consolidated/{prompts,generations,labels}.parquet`` in the schemas consolidation writes
(``hallulog.postrun.parquet.SCHEMAS``, the same row-group sizes), ``run_manifest.json``,
``evaluation/scores.parquet`` (``write_scores``) and ``evaluation/report.json`` whose
``methods`` are ``summarize_scores`` of that table (a small bootstrap). No model, no server:
10^5 prompts with K = 5 take seconds.

    python bench/view_run.py ROOT --prompts 100000 --k 5
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from hallulog.contracts import layout  # noqa: E402
from hallulog.evaluation.scores import ScoreTable, summarize_scores, write_scores  # noqa: E402
from hallulog.postrun.parquet import ROW_GROUP_ROWS, SCHEMAS  # noqa: E402

__all__ = ["write_view_run", "METHODS"]

#: (method, family, signal strength): higher signal = a better detector
METHODS = [
    ("logprob_mean", "logprob", 1.2),
    ("logprob_min", "logprob", 1.0),
    ("mean_token_entropy", "token_entropy", 0.9),
    ("se_discrete_exact", "semantic_entropy", 1.4),
    ("selfcheck_unigram", "selfcheck", 0.6),
    ("got_logistic_last", "geometry", 1.6),
    ("sep_tbg", "sep", 0.3),
    ("lexsim_rougeL", "lexical_similarity", 0.8),
]
_VOCAB = np.array(
    [" Paris", " Rome", " the", " city", " of", " is", " a", "The", " answer", " Lyon", "."]
)
_SPLIT = 8  # questions per prompt text variant


def _hex_ids(rng: np.random.Generator, n: int) -> list[str]:
    return [f"{int(v):016x}" for v in rng.integers(0, 2**63, n, dtype=np.int64)]


def _lists(values: pa.Array, width: int) -> pa.Array:
    offsets = pa.array(np.arange(0, len(values) + 1, width, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, values)


def _generations(
    rng: np.random.Generator, pids: list[str], labels: np.ndarray, k: int, tokens: int
) -> pa.Table:
    n = len(pids) * (k + 1)
    sample = np.tile(np.arange(k + 1, dtype=np.int32), len(pids))
    tok = rng.integers(0, len(_VOCAB), (n, tokens))
    lp = -rng.exponential(0.6, (n, tokens)).astype(np.float32)
    top_idx = (tok[..., None] + np.arange(5)) % len(_VOCAB)
    top_lp = np.sort(-rng.exponential(2.0, (n, tokens, 5)), axis=-1)[..., ::-1]
    top_lp[..., 0] = lp
    vocab = pa.array(_VOCAB)
    tok_text = vocab.take(pa.array(tok.ravel()))
    texts = ["".join(_VOCAB[row]).strip() for row in tok]
    glabel = np.repeat(labels, k + 1)
    status = np.where(np.isnan(glabel), None, np.where(glabel == 1, "incorrect", "correct"))
    cols = {
        "prompt_id": pa.array(np.repeat(pids, k + 1)),
        "sample_id": pa.array(sample),
        "role": pa.array(np.where(sample == 0, "primary", "sample")),
        "text": pa.array(texts),
        "finish_reason": pa.array(["stop"] * n),
        "prompt_tokens": pa.array(np.full(n, 40, np.int32)),
        "completion_tokens": pa.array(np.full(n, tokens, np.int32)),
        "token_ids": _lists(pa.array(tok.ravel().astype(np.int32)), tokens),
        "tokens": _lists(tok_text, tokens),
        "token_logprobs": _lists(pa.array(lp.ravel()), tokens),
        "token_logits": _lists(pa.array((lp.ravel() + 20).astype(np.float32)), tokens),
        "top_logprob_tokens": _lists(_lists(vocab.take(pa.array(top_idx.ravel())), 5), tokens),
        "top_logprobs": _lists(_lists(pa.array(top_lp.ravel().astype(np.float32)), 5), tokens),
        "temperature": pa.array(np.where(sample == 0, 0.0, 0.7).astype(np.float32)),
        "top_p": pa.array(np.where(sample == 0, 1.0, 0.95).astype(np.float32)),
        "seed": pa.array(np.arange(n, dtype=np.int64)),
        "max_tokens": pa.array(np.full(n, tokens, np.int32)),
        "generation_time_ms": pa.array(np.full(n, 5, np.int64)),
        "label": pa.array(np.where(np.isnan(glabel), None, glabel), pa.int8()),
        "label_grader": pa.array(["alias_match"] * n),
        "label_status": pa.array(status, pa.string()),
        "answer_span": pa.array([None] * n, pa.list_(pa.int32())),
        "activation_key": pa.array([f"{p}_{s}" for p, s in zip(np.repeat(pids, k + 1), sample)]),
        "worker_id": pa.array(np.zeros(n, np.int32)),
        "commit_id": pa.array(["c0"] * n),
        "extra_json": pa.array([None] * n, pa.string()),
    }
    return pa.table(cols, schema=SCHEMAS[layout.GENERATIONS_PARQUET])


def _prompts(pids: list[str], labels: np.ndarray, start: int) -> tuple[pa.Table, pa.Table]:
    n = len(pids)
    idx = np.arange(start, start + n)
    questions = [f"Which city is meant by riddle number {i}?" for i in idx]
    prompts = [
        f"Answer the question with a short answer.\nQuestion: {q}\nAnswer:" for q in questions
    ]
    refs = np.where(idx % 2 == 1, "Paris", "Rome")
    lab = pa.array(np.where(np.isnan(labels), None, labels), pa.int8())
    status = np.where(np.isnan(labels), None, np.where(labels == 1, "incorrect", "correct"))
    p = {
        "prompt_id": pa.array(pids),
        "dataset": pa.array(["triviaqa"] * n),
        "split": pa.array(["dev"] * n),
        "dataset_id": pa.array([f"bench_{i:07d}" for i in idx]),
        "prompt": pa.array(prompts),
        "messages": pa.array([[{"role": "user", "content": t}] for t in prompts]),
        "question": pa.array(questions),
        "reference_answer": pa.array(refs),
        "reference_aliases": pa.array([[r] for r in refs]),
        "label": lab,
        "label_grader": pa.array(["alias_match"] * n),
        "label_status": pa.array(status, pa.string()),
        "judge_verdict": pa.array([None] * n, pa.string()),
        "prompt_token_ids": pa.array([[1, 2, 3]] * n, pa.list_(pa.int32())),
        "num_generations": pa.array(np.full(n, 6, np.int32)),
        "worker_id": pa.array(np.zeros(n, np.int32)),
        "completed_at": pa.array(["2026-01-01T00:00:00+00:00"] * n),
        "commit_id": pa.array(["c0"] * n),
        "meta_json": pa.array([json.dumps({"question": q}) for q in questions]),
        "extra_json": pa.array([None] * n, pa.string()),
    }
    lab_t = {
        "prompt_id": pa.array(pids),
        "label": lab,
        "label_grader": pa.array(["alias_match"] * n),
        "label_source": pa.array(["worker"] * n),
        "verdict": pa.array([None] * n, pa.string()),
        "abstained": pa.array([None] * n, pa.bool_()),
        "judge_model": pa.array([None] * n, pa.string()),
        "judge_verdict": pa.array([None] * n, pa.string()),
    }
    return (
        pa.table(p, schema=SCHEMAS[layout.PROMPTS_PARQUET]),
        pa.table(lab_t, schema=SCHEMAS[layout.LABELS_PARQUET]),
    )


def write_view_run(
    root: Path | str,
    prompts: int,
    *,
    k: int = 5,
    tokens: int = 12,
    seed: int = 0,
    unlabelled: float = 0.05,
    n_boot: int = 20,
) -> Path:
    """Write the run; returns its root. Labels: 40 % hallucinated, ``unlabelled`` share null."""
    root = Path(root)
    cons = layout.consolidated_dir(root)
    cons.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    pids = _hex_ids(rng, prompts)
    labels = (rng.random(prompts) < 0.4).astype(np.float64)
    labels[rng.random(prompts) < unlabelled] = np.nan
    writers = {
        name: pq.ParquetWriter(cons / name, SCHEMAS[name], compression="zstd")
        for name in (layout.PROMPTS_PARQUET, layout.GENERATIONS_PARQUET, layout.LABELS_PARQUET)
    }
    try:
        for start in range(0, prompts, ROW_GROUP_ROWS):
            chunk = slice(start, start + ROW_GROUP_ROWS)
            p, lab = _prompts(pids[chunk], labels[chunk], start)
            writers[layout.PROMPTS_PARQUET].write_table(p, row_group_size=ROW_GROUP_ROWS)
            writers[layout.LABELS_PARQUET].write_table(lab, row_group_size=ROW_GROUP_ROWS)
            g = _generations(rng, pids[chunk], labels[chunk], k, tokens)
            writers[layout.GENERATIONS_PARQUET].write_table(g, row_group_size=ROW_GROUP_ROWS // 4)
    finally:
        for w in writers.values():
            w.close()
    _write_manifest(root, prompts, k, tokens)
    _write_evaluation(root, rng, pids, labels, n_boot)
    return root


def _write_manifest(root: Path, prompts: int, k: int, tokens: int) -> None:
    manifest = {
        "run_id": "view-bench",
        "model": "synthetic",
        "dataset": "triviaqa",
        "split": "dev",
        "k_samples": k,
        "max_tokens": tokens,
        "logging_profile": "integrated",
        "storage_format": "packed",
        "total_prompts": prompts,
        "config": {"task": "triviaqa", "k_samples": k, "max_tokens": tokens, "seed": 0},
    }
    (root / layout.MANIFEST).write_text(json.dumps(manifest, indent=2))


def _write_evaluation(
    root: Path, rng: np.random.Generator, pids: list[str], labels: np.ndarray, n_boot: int
) -> None:
    keep = ~np.isnan(labels)
    y = labels[keep].astype(np.int64)
    scores = {}
    for name, _family, signal in METHODS:
        scores[name] = y * signal + rng.normal(0, 1, len(y))
    scores["sep_tbg"][rng.random(len(y)) < 0.1] = np.nan  # a method without every score
    table = ScoreTable(
        prompt_ids=[p for p, k in zip(pids, keep) if k],
        labels=y,
        fold=np.arange(len(y)) % 5,
        test=np.ones(len(y), bool),
        scores=scores,
        n_boot=n_boot,
    )
    out = layout.evaluation_dir(root)
    write_scores(table, out / layout.SCORES)
    methods, comparison = summarize_scores(table)
    families = {name: family for name, family, _ in METHODS}
    for name, r in methods.items():
        r["family"] = families[name]
        r["kind"] = "probe" if families[name] in ("geometry", "sep") else "unsupervised"
    per_layer = {
        "got_logistic_last": {
            "layer_ids": [0, 1, 2, 3],
            "auroc": [0.55, 0.7, 0.82, 0.79],
            "selected_layers": [2] * 5,
        }
    }
    report = {
        "labels": {
            "correct": int((y == 0).sum()),
            "hallucinated": int((y == 1).sum()),
            "unlabeled": int((~keep).sum()),
        },
        "protocol": {"seed": 0, "scheme": "5-fold", "test_prompts": len(y), "bootstrap": n_boot},
        "methods": methods,
        "comparison": comparison,
        "per_layer": per_layer,
        "skipped": {"eigenscore": "synthetic run: no activations"},
        "plots": [],
    }
    (out / layout.REPORT_JSON).write_text(json.dumps(report, indent=1, allow_nan=True))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--prompts", type=int, default=100_000)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=12)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    write_view_run(args.root, args.prompts, k=args.k, tokens=args.tokens)
    print(f"{args.root}: {args.prompts} prompts in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

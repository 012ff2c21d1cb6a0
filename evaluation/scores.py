"""Per-prompt scores: ``evaluation/scores.parquet`` and the report's metrics computed from it.

One row per labelled prompt: ``prompt_id``, ``label`` (1 = hallucinated), ``fold`` (its fold
of the split), ``test`` (scored in the report: every prompt under k-fold, the test fold under
holdout) and one float64 column per method (NaN where the method has no score), oriented higher
= more likely hallucinated. The parquet's metadata records which columns are logits of a
probability (ECE and Brier use their sigmoid), the seed and the bootstrap size, so
``summarize_scores(read_scores(path))`` recomputes every figure of ``report.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from hallulog.contracts import layout
from hallulog.evaluation.metrics import metric_intervals, paired_differences, point_metrics
from hallulog.evaluation.protocol import summarize

__all__ = [
    "ScoreTable",
    "write_scores",
    "read_scores",
    "summarize_scores",
    "summarize_method",
    "SCORES_FILE",
]

SCORES_FILE = layout.SCORES
_META_KEY = b"hallulog.scores"


@dataclass
class ScoreTable:
    prompt_ids: list[str]
    labels: np.ndarray
    fold: np.ndarray
    test: np.ndarray
    scores: dict[str, np.ndarray]
    probability: list[str] = field(default_factory=list)  # columns that are logits of P(h)
    seed: int = 0
    n_boot: int = 1000


def write_scores(table: ScoreTable, path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = {
        "prompt_id": pa.array(table.prompt_ids, pa.string()),
        "label": pa.array(np.asarray(table.labels, np.int8)),
        "fold": pa.array(np.asarray(table.fold, np.int16)),
        "test": pa.array(np.asarray(table.test, bool)),
    }
    for m, v in table.scores.items():
        cols[m] = pa.array(np.asarray(v, np.float64))
    t = pa.table(cols)
    meta = {
        "probability": table.probability,
        "seed": table.seed,
        "bootstrap": table.n_boot,
        "orientation": "higher = more likely hallucinated",
    }
    t = t.replace_schema_metadata(
        {**(t.schema.metadata or {}), _META_KEY: json.dumps(meta).encode()}
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    pq.write_table(t, tmp)
    tmp.replace(path)
    return path


def read_scores(path: Path | str) -> ScoreTable:
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    meta = json.loads((t.schema.metadata or {}).get(_META_KEY, b"{}"))
    fixed = {"prompt_id", "label", "fold", "test"}
    return ScoreTable(
        prompt_ids=t.column("prompt_id").to_pylist(),
        labels=t.column("label").to_numpy().astype(np.int64),
        fold=t.column("fold").to_numpy().astype(np.int64),
        test=t.column("test").to_numpy(zero_copy_only=False).astype(bool),
        scores={
            c: t.column(c).to_numpy(zero_copy_only=False).astype(np.float64)
            for c in t.column_names
            if c not in fixed
        },
        probability=list(meta.get("probability", [])),
        seed=int(meta.get("seed", 0)),
        n_boot=int(meta.get("bootstrap", 1000)),
    )


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def summarize_method(
    labels: np.ndarray, scores: np.ndarray, *, probability: bool, n_boot: int, seed: int
) -> dict:
    """One method's ``{auroc, ci95, n, n_hallucinated, metrics, metrics_ci95}`` on the given
    (test) prompts, those with a finite score; ``probability``: the scores are logits of
    P(hallucinated) (ECE and Brier are computed on their sigmoid)."""
    r = summarize(labels, scores, n_boot=n_boot, seed=seed)
    ok = np.isfinite(scores)
    y, s = labels[ok], scores[ok]
    prob = _sigmoid(s) if probability else None
    if len(y) and len(np.unique(y)) == 2:
        r["metrics"] = point_metrics(y, s, prob)
        r["metrics_ci95"] = metric_intervals(y, s, prob, n_boot=n_boot, seed=seed)
    return r


def summarize_scores(table: ScoreTable) -> tuple[dict[str, dict], dict]:
    """``({method: {auroc, ci95, n, n_hallucinated, metrics, metrics_ci95}}, comparison)`` on
    the test prompts; ``comparison``: the best method by AUROC against every other one
    (paired bootstrap of the AUROC and PRR differences)."""
    test = table.test
    y_all = table.labels[test]
    out: dict[str, dict] = {}
    for m, v in table.scores.items():
        out[m] = summarize_method(
            y_all,
            v[test],
            probability=m in table.probability,
            n_boot=table.n_boot,
            seed=table.seed,
        )
    finite = {m: r["auroc"] for m, r in out.items() if np.isfinite(r["auroc"])}
    comparison: dict = {}
    if finite:
        best = max(finite, key=lambda m: (finite[m], m))
        comparison = {"best": best, "against": {}}
        for m in finite:
            if m != best:
                comparison["against"][m] = paired_differences(
                    y_all,
                    table.scores[best][test],
                    table.scores[m][test],
                    n_boot=table.n_boot,
                    seed=table.seed,
                )
    return out, comparison

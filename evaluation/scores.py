"""Per-prompt scores: ``evaluation/scores.parquet`` and the report's metrics computed from it.

One row per labelled prompt: ``prompt_id``, ``label`` (1 = hallucinated), ``fold`` (its fold
of the split), ``test`` (scored in the report: every prompt under k-fold, the test fold under
holdout) and one float64 column per method (NaN where the method has no score), oriented higher
= more likely hallucinated. The parquet's metadata records which columns are logits of a
probability (ECE and Brier use their sigmoid), the seed and the bootstrap size, so
``summarize_scores(read_scores(path))`` recomputes every figure of ``report.json``.

Guard columns (docs/evaluation.md, "Guards"): ``leaked`` (bool: the reference answer is in what
the model was given) and ``label_<grader>`` (int8, null where that grader gave no label) for
every grader beside the primary one. The metadata's ``methods`` names the method columns and
``guards`` the guard columns; a reader takes the method columns from ``methods`` (files written
before it: every column but the four fixed ones).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from hallulog.contracts import layout
from hallulog.evaluation.graders import agreement
from hallulog.evaluation.metrics import (
    COVERAGES,
    fpr_at_tpr,
    metric_intervals,
    paired_differences,
    point_metrics,
    prr,
    risk_coverage,
)
from hallulog.evaluation.protocol import auroc, summarize

__all__ = [
    "ScoreTable",
    "write_scores",
    "read_scores",
    "summarize_scores",
    "summarize_method",
    "grader_summary",
    "rankings",
    "SCORES_FILE",
    "RANKED_BY",
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
    leaked: np.ndarray | None = None  # bool per prompt (None: not checked, files before it)
    graders: dict[str, np.ndarray] = field(default_factory=dict)  # other graders' labels, NaN
    primary_grader: str | None = None


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
    guards = []
    if table.leaked is not None:
        cols["leaked"] = pa.array(np.asarray(table.leaked, bool))
        guards.append("leaked")
    for g, lab in table.graders.items():
        lab = np.asarray(lab, np.float64)
        cols[f"label_{g}"] = pa.array(
            np.where(np.isfinite(lab), lab, 0).astype(np.int8), mask=~np.isfinite(lab)
        )
        guards.append(f"label_{g}")
    t = pa.table(cols)
    meta = {
        "probability": table.probability,
        "seed": table.seed,
        "bootstrap": table.n_boot,
        "orientation": "higher = more likely hallucinated",
        "methods": list(table.scores),
        "guards": guards,
        "primary_grader": table.primary_grader,
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
    fixed = {"prompt_id", "label", "fold", "test", *meta.get("guards", [])}
    methods = meta.get("methods") or [c for c in t.column_names if c not in fixed]
    graders = {
        c[len("label_") :]: t.column(c).to_numpy(zero_copy_only=False).astype(np.float64)
        for c in meta.get("guards", [])
        if c.startswith("label_")
    }
    return ScoreTable(
        prompt_ids=t.column("prompt_id").to_pylist(),
        labels=t.column("label").to_numpy().astype(np.int64),
        fold=t.column("fold").to_numpy().astype(np.int64),
        test=t.column("test").to_numpy(zero_copy_only=False).astype(bool),
        scores={c: t.column(c).to_numpy(zero_copy_only=False).astype(np.float64) for c in methods},
        probability=list(meta.get("probability", [])),
        seed=int(meta.get("seed", 0)),
        n_boot=int(meta.get("bootstrap", 1000)),
        leaked=(
            t.column("leaked").to_numpy(zero_copy_only=False).astype(bool)
            if "leaked" in meta.get("guards", [])
            else None
        ),
        graders=graders,
        primary_grader=meta.get("primary_grader"),
    )


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _subset(y_all, s_all, keep, prob_method: bool, n_boot: int, seed: int) -> dict:
    """AUROC with its interval, n and every point metric on the prompts ``keep``."""
    r = summarize(y_all[keep], s_all[keep], n_boot=n_boot, seed=seed)
    ok = keep & np.isfinite(s_all)
    y, s = y_all[ok], s_all[ok]
    if len(y) and len(np.unique(y)) == 2:
        r["metrics"] = point_metrics(y, s, _sigmoid(s) if prob_method else None)
    return r


def summarize_method(
    labels: np.ndarray, scores: np.ndarray, *, probability: bool, n_boot: int, seed: int
) -> dict:
    """One method's ``{auroc, ci95, n, n_hallucinated, metrics, metrics_ci95, risk_coverage}``
    on the given (test) prompts, those with a finite score; ``probability``: the scores are
    logits of P(hallucinated) (ECE and Brier are computed on their sigmoid)."""
    r = summarize(labels, scores, n_boot=n_boot, seed=seed)
    ok = np.isfinite(scores)
    y, s = labels[ok], scores[ok]
    prob = _sigmoid(s) if probability else None
    if len(y) and len(np.unique(y)) == 2:
        r["metrics"] = point_metrics(y, s, prob)
        r["metrics_ci95"] = metric_intervals(y, s, prob, n_boot=n_boot, seed=seed)
        r["risk_coverage"] = {"coverage": list(COVERAGES), "risk": risk_coverage(y, s, COVERAGES)}
    return r


def summarize_scores(table: ScoreTable) -> tuple[dict[str, dict], dict]:
    """``({method: {auroc, ci95, n, n_hallucinated, metrics, metrics_ci95, risk_coverage,
    unleaked}}, comparison)`` on the test prompts; ``comparison``: the best method by AUROC
    against every other one (paired bootstrap of the AUROC and PRR differences).

    ``unleaked`` (when the table has the leakage flag): the same figures on the test prompts
    that are not leaked (equal to the all-prompt ones when none is)."""
    test = table.test
    y_all = table.labels[test]
    leaked = None if table.leaked is None else np.asarray(table.leaked, bool)[test]
    out: dict[str, dict] = {}
    for m, v in table.scores.items():
        s_all = v[test]
        r = summarize_method(
            y_all, s_all, probability=m in table.probability, n_boot=table.n_boot, seed=table.seed
        )
        if leaked is not None:
            if leaked.any():
                r["unleaked"] = _subset(
                    y_all, s_all, ~leaked, m in table.probability, table.n_boot, table.seed
                )
            else:
                r["unleaked"] = {
                    k: r[k] for k in ("auroc", "ci95", "n", "n_hallucinated", "metrics") if k in r
                }
        out[m] = r
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


#: the metrics the report ranks by (higher is better for the first two, lower for FPR@95)
RANKED_BY = {"auroc": True, "prr": True, "fpr_at_95_tpr": False}


def rankings(summary: dict[str, dict]) -> dict[str, list[str]]:
    """The methods in order of each of ``RANKED_BY`` (best first; methods without it last)."""
    out = {}
    for key, higher in RANKED_BY.items():

        def value(m, key=key, higher=higher):
            r = summary[m]
            v = r.get("auroc") if key == "auroc" else (r.get("metrics") or {}).get(key)
            v = float("nan") if v is None else float(v)
            return (0, -v if higher else v, m) if np.isfinite(v) else (1, 0.0, m)

        out[key] = sorted(summary, key=value)
    return out


def grader_summary(table: ScoreTable) -> dict:
    """For every grader beside the primary one: its agreement with the primary labels (Cohen's
    kappa, raw agreement, counts) and every method's AUROC, PRR and FPR@95 under its labels, on
    the test prompts both graders label."""
    test = table.test
    y = table.labels[test].astype(np.float64)
    out = {}
    for g, lab in table.graders.items():
        other = np.asarray(lab, np.float64)[test]
        entry = {"agreement": agreement(y, other), "methods": {}}
        both = np.isfinite(other)
        for m, v in table.scores.items():
            s = v[test]
            ok = both & np.isfinite(s)
            yy = other[ok].astype(int)
            if len(np.unique(yy)) < 2:
                continue
            entry["methods"][m] = {
                "n": int(ok.sum()),
                "auroc": auroc(yy, s[ok]),
                "prr": prr(yy, s[ok]),
                "fpr_at_95_tpr": fpr_at_tpr(yy, s[ok]),
            }
        out[g] = entry
    return out

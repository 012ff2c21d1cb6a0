"""The protocol guards: the leakage rule, grader agreement, FPR@95 and the risk-coverage curve,
and their place in scores.parquet and the report."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hallulog.evaluation.cli import add_evaluate_parser, run_evaluate
from hallulog.evaluation.graders import agreement, other_labels
from hallulog.evaluation.leakage import accepted_answers, find_leak
from hallulog.evaluation.metrics import fpr_at_tpr, rcc_auc, risk_coverage, risk_curve
from hallulog.evaluation.scores import (
    ScoreTable,
    grader_summary,
    rankings,
    read_scores,
    summarize_scores,
    write_scores,
)
from sklearn.metrics import cohen_kappa_score, roc_auc_score, roc_curve

from tests.evaluation.synthetic import make_run


def _row(prompt, question=None, context=None, aliases=("Paris",), kind=None, **extra):
    ref = {"value": aliases[0] if aliases else None, "aliases": list(aliases)}
    if kind:
        ref["kind"] = kind
    return {
        "prompt": prompt,
        "messages": [{"role": "user", "content": prompt}],
        "reference": ref,
        "meta": {"question": question, "context": context},
        **extra,
    }


def test_leak_is_the_alias_rule_over_what_the_model_saw():
    q = "Which city is the capital of France?"
    assert not find_leak(_row(f"Q: {q}", q)).leaked
    ctx = "The capital of France is Paris, on the Seine."
    leak = find_leak(_row(f"Context: {ctx}\nQ: {q}", q, ctx))
    assert leak.leaked and leak.source == "context"
    # normalised as the grader normalises: case, punctuation, articles
    assert find_leak(_row("Is it THE paris?", aliases=("Paris",))).leaked
    assert not find_leak(_row("Parisian food", aliases=("Paris",))).leaked
    assert (
        find_leak(
            _row(
                "Who wrote Middlemarch (Mary Ann Evans)?",
                "x",
                aliases=("George Eliot", "Mary Ann Evans"),
            )
        ).source
        == "prompt"
    )
    # the context counts only when the model was given it
    assert not find_leak(_row(f"Q: {q}", q, ctx)).leaked
    # a few-shot example in another message is part of the prompt
    row = _row(f"Q: {q}")
    row["messages"] = [
        {"role": "user", "content": "Q: x"},
        {"role": "assistant", "content": "Paris"},
        *row["messages"],
    ]
    assert find_leak(row).leaked


def test_choice_numeric_and_unanswerable_references_are_not_checked():
    assert accepted_answers({"kind": "choice", "choices": ["Paris"], "answer_index": 0}) == []
    assert accepted_answers({"kind": "numeric", "number": 4}) == []
    assert accepted_answers({"kind": "aliases", "aliases": [], "unanswerable": True}) == []
    assert not find_leak(_row("Paris?", kind="numeric")).checked
    assert accepted_answers({"kind": "judge", "value": "Paris", "aliases": ["City of Light"]}) == [
        "Paris",
        "City of Light",
    ]


def test_other_graders_and_kappa():
    judge = {"label_grader": "llm_judge", "reference": {"kind": "judge", "value": "Paris"}}
    assert other_labels(judge, {"text": "It is Paris.", "label": None}) == {"alias_match": 0}
    assert other_labels(judge, {"text": "Lyon", "label": 1, "label_grader": "alias_match"}) == {
        "alias_match": 1
    }
    alias = {"label_grader": "alias_match", "reference": {"aliases": ["Paris"]}}
    assert other_labels(alias, {"text": "Lyon", "label": 1, "label_grader": "alias_match"}) == {}
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2, 80).astype(float)
    b = np.where(rng.random(80) < 0.8, a, 1 - a)
    b[:5] = np.nan
    r = agreement(a, b)
    ok = np.isfinite(b)
    assert r["n"] == 75
    assert r["kappa"] == pytest.approx(cohen_kappa_score(a[ok], b[ok]), abs=1e-12)
    assert r["agreement"] == pytest.approx((a[ok] == b[ok]).mean())


@pytest.mark.parametrize("ties", [False, True])
def test_fpr95_equals_sklearn_and_the_risk_curve_averages_to_rcc_auc(ties):
    for seed in range(30):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(6, 150))
        y = rng.integers(0, 2, n)
        if len(np.unique(y)) < 2:
            continue
        s = rng.normal(size=n) + y
        if ties:
            s = np.round(s)
        fpr, tpr, _ = roc_curve(y, s)
        assert fpr_at_tpr(y, s) == pytest.approx(fpr[np.searchsorted(tpr, 0.95)], abs=1e-12)
        cov, risk = risk_curve(y, s)
        assert risk.mean() == pytest.approx(rcc_auc(y, s), abs=1e-12)
        if not ties:  # without ties: the hallucination rate of the m lowest scores
            order = np.argsort(s)
            m = max(1, round(0.3 * n))
            assert risk_coverage(y, s, [0.3])[0] == pytest.approx(y[order[:m]].mean())


def _table(n=120, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    leaked = rng.random(n) < 0.3
    s_leak = np.where(leaked, y * 3.0, 0.0) + rng.normal(size=n)  # separates only leaked ones
    other = np.where(rng.random(n) < 0.9, y, 1 - y).astype(float)
    return ScoreTable(
        prompt_ids=[f"p{i}" for i in range(n)],
        labels=y,
        fold=np.arange(n) % 5,
        test=np.ones(n, bool),
        scores={"leaky": s_leak, "plain": rng.normal(size=n) + y},
        seed=0,
        n_boot=50,
        leaked=leaked,
        graders={"llm_judge": other},
        primary_grader="alias_match",
    )


def test_unleaked_metrics_are_those_of_the_unleaked_prompts(tmp_path):
    table = _table()
    summary, _ = summarize_scores(table)
    keep = ~table.leaked
    from hallulog.evaluation.metrics import point_metrics

    ref = point_metrics(table.labels[keep], table.scores["leaky"][keep])
    u = summary["leaky"]["unleaked"]
    assert u["n"] == int(keep.sum()) and u["metrics"]["auroc"] == pytest.approx(ref["auroc"])
    assert u["metrics"]["prr"] == pytest.approx(ref["prr"])
    assert summary["leaky"]["auroc"] - u["auroc"] > 0.1
    assert summary["leaky"]["risk_coverage"]["coverage"][-1] == 1.0
    ranks = rankings(summary)
    assert ranks["auroc"] == sorted(summary, key=lambda m: -summary[m]["auroc"])
    fpr = {m: summary[m]["metrics"]["fpr_at_95_tpr"] for m in summary}
    assert ranks["fpr_at_95_tpr"] == sorted(summary, key=lambda m: (fpr[m], m))
    g = grader_summary(table)["llm_judge"]
    assert g["agreement"]["n"] == 120 and set(g["methods"]) == {"leaky", "plain"}
    write_scores(table, tmp_path / "s.parquet")
    back = read_scores(tmp_path / "s.parquet")
    assert set(back.scores) == {"leaky", "plain"}
    np.testing.assert_array_equal(back.leaked, table.leaked)
    np.testing.assert_array_equal(back.graders["llm_judge"], table.graders["llm_judge"])
    assert summarize_scores(back)[0]["leaky"]["unleaked"] == u


def test_report_has_the_guards_and_the_risk_coverage_png(tmp_path, capsys):
    import argparse

    root = make_run(tmp_path / "run", n=40)
    p = argparse.ArgumentParser()
    add_evaluate_parser(p.add_subparsers(dest="cmd"))
    args = p.parse_args(
        [
            "evaluate",
            "--artifact-root",
            str(root),
            "--no-embeddings",
            "--bootstrap",
            "30",
            "--methods",
            "logprob",
            "selfcheck",
            "geometry",
        ]
    )
    assert run_evaluate(args) == 0
    out = root / "evaluation"
    report = json.loads((out / "report.json").read_text())
    assert report["leakage"]["checked"] == 40
    assert set(report["ranking"]) == {"auroc", "prr", "fpr_at_95_tpr"}
    assert all("fpr_at_95_tpr" in r["metrics"] for r in report["methods"].values())
    assert report["graders"]["primary"] == "alias_match"
    md = (out / "report.md").read_text()
    assert "FPR@95" in md and "## Risk–coverage" in md and "## Leakage" in md
    assert (out / "risk_coverage.png").stat().st_size > 10_000
    assert "risk_coverage.png" in report["plots"]


def test_a_judge_labelled_run_reports_the_alias_grader_beside_it(tmp_path):
    """Prompt labels from a judge (as consolidation writes them from labels.jsonl), the workers'
    alias labels on the primary generations: evaluate reports both and their agreement."""
    import shutil

    from hallulog.contracts.jsonl import encode_line, iter_rows
    from hallulog.evaluation.evaluate import evaluate
    from hallulog.exports.methods import write_exports

    root = make_run(tmp_path / "run", n=40)
    path = root / "consolidated" / "prompt_index.jsonl"
    rows = list(iter_rows(path))
    flipped = set()
    for i, row in enumerate(rows):
        row["label_grader"] = "llm_judge"
        if i % 7 == 0:
            row["label"] = 1 - row["label"]
            flipped.add(row["prompt_id"])
    path.write_bytes(b"".join(encode_line(r) for r in rows))
    shutil.rmtree(root / "consolidated" / "exports")
    write_exports(root)
    report = evaluate(root, methods=["logprob"], embeddings=False, n_boot=20)
    g = report["graders"]
    assert g["primary"] == "llm_judge" and set(g["others"]) == {"alias_match"}
    a = g["others"]["alias_match"]["agreement"]
    assert a["n"] == 40 and a["agreement"] == pytest.approx(1 - len(flipped) / 40)
    judge = np.array([r["label"] for r in rows])
    alias = np.array(
        [r["label"] if r["prompt_id"] not in flipped else 1 - r["label"] for r in rows]
    )
    assert a["kappa"] == pytest.approx(cohen_kappa_score(judge, alias))
    m = g["others"]["alias_match"]["methods"]["logprob_mean"]
    table = report["_scores"]
    assert m["auroc"] == pytest.approx(
        roc_auc_score(table.graders["alias_match"], table.scores["logprob_mean"])
    )


def test_primaries_come_from_the_parquet_table_as_from_the_jsonl(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from hallulog.contracts.jsonl import iter_rows
    from hallulog.evaluation.data import Run
    from hallulog.evaluation.guards import _PRIMARY_COLUMNS, _primaries

    root = make_run(tmp_path / "run", n=12, k=2)
    run = Run(root)
    from_jsonl = [{k: g.get(k) for k in _PRIMARY_COLUMNS} for g in _primaries(run)]
    gens = list(iter_rows(root / "consolidated" / "generations.jsonl"))
    table = pa.table(
        {
            "prompt_id": [g["prompt_id"] for g in gens],
            "sample_id": pa.array([g["sample_id"] for g in gens], pa.int32()),
            "text": [g["text"] for g in gens],
            "label": pa.array([g.get("label") for g in gens], pa.int8()),
            "label_grader": [g.get("label_grader") for g in gens],
            "token_logprobs": [[t["logprob"] for t in g["logprobs"]] for g in gens],
        }
    )
    pq.write_table(table, root / "consolidated" / "generations.parquet")
    from_parquet = list(_primaries(run))
    assert from_parquet == from_jsonl and len(from_parquet) == 12

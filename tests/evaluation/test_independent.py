"""``orchestrator evaluate``'s text methods against an independent implementation from the docs.

tests/evaluation/independent.py re-derives every text method from docs/evaluation.md without
importing the evaluate package. On a synthetic run whose answers are multi-word sentences (so
that clustering, smoothing and energies all matter) the two must agree prompt by prompt, and
the report's AUROCs must equal scikit-learn's on the independent scores.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hallulog.cli.app import main
from hallulog.evaluation.data import Run
from hallulog.evaluation.features import collect
from hallulog.evaluation.scores import read_scores
from hallulog.exports.methods import write_exports
from sklearn.metrics import roc_auc_score

from tests.evaluation.independent import (
    METHODS,
    independent_aurocs,
    independent_eigenscore,
    independent_probe_per_layer,
    independent_scores,
)
from tests.evaluation.synthetic import make_run

_VOCAB = [
    "the",
    "capital",
    "is",
    "Paris",
    "London",
    "Rome",
    "it",
    "was",
    "a",
    "city",
    "in",
    "France",
    "Italy",
    "I",
    "think",
    "answer",
    "maybe",
]


def _sentences(root, seed=0):
    """Rewrite the run's answers as sentences: correct prompts repeat theirs (with case and
    punctuation variants that normalise equal), hallucinated ones vary; answers get 2 to 4
    tokens (so that token means and sums rank differently); then re-export."""
    rng = np.random.default_rng(seed)
    path = root / "consolidated" / "generations.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    base: dict[str, str] = {}
    for r in rows:
        pid = r["prompt_id"]
        if pid not in base:
            base[pid] = " ".join(rng.choice(_VOCAB, rng.integers(2, 7)))
        hallucinated = r["label"] == 1 if r["sample_id"] == 0 else rng.random() < 0.5
        if r["sample_id"] and (hallucinated or rng.random() < 0.3):
            text = " ".join(rng.choice(_VOCAB, rng.integers(1, 8)))
        else:
            text = base[pid]
        r["text"] = rng.choice([text, text.upper(), f"The {text}.", f"{text}!"])
        keep = int(rng.integers(1, len(r["logprobs"])))  # answers of 2..4 tokens
        r["logprobs"] = r["logprobs"][:keep] + r["logprobs"][-1:]
        for e in r["logprobs"]:  # top-5: the chosen token, a case/space variant of it, others
            alts = [f" {e['token'].strip().upper()}", "foo", "bar", " baz"][
                : int(rng.integers(1, 5))
            ]
            lower = e["logprob"] - rng.exponential(1.5, len(alts))
            e["top_logprobs"] = [{"token": e["token"], "logprob": e["logprob"]}] + [
                {"token": t, "logprob": float(v)} for t, v in zip(alts, lower)
            ]
        r["token_ids"] = r["token_ids"][:keep] + r["token_ids"][-1:]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_exports(root)
    return root


@pytest.fixture(scope="module")
def run_root(tmp_path_factory):
    root = make_run(tmp_path_factory.mktemp("independent") / "run", n=80, k=5, seed=3)
    return _sentences(root)


def test_every_prompt_scores_as_the_docs_define(run_root):
    ids, labels, ours_ind = independent_scores(run_root)
    feats = collect(Run(run_root), set(METHODS))
    order = np.argsort(feats.prompt_ids)
    assert [feats.prompt_ids[i] for i in order] == ids
    np.testing.assert_array_equal(np.asarray(feats.labels)[order], labels)
    for m in METHODS:
        np.testing.assert_allclose(
            np.asarray(feats.scores[m])[order], ours_ind[m], rtol=1e-9, atol=1e-12, err_msg=m
        )


def test_the_fixture_tells_the_definitions_apart(run_root):
    """The check can fail: e.g. SE over the primary + K answers instead of the K samples, or
    summed instead of mean token energies, give other scores on this fixture."""
    from collections import Counter

    from tests.evaluation.independent import _entropy_of_counts, _read, _squad_normalise

    ex = run_root / "consolidated" / "exports"
    se = _read(ex / "semantic_entropy_inputs.jsonl")
    en = _read(ex / "semantic_energy_inputs.jsonl")
    with_primary = [
        _entropy_of_counts(
            Counter(
                _squad_normalise(t)
                for t in [r["primary"]["text"]] + [s["text"] for s in r["samples"]]
            ).values()
        )
        for r in se.values()
    ]
    without = [
        _entropy_of_counts(Counter(_squad_normalise(s["text"]) for s in r["samples"]).values())
        for r in se.values()
    ]
    assert not np.allclose(with_primary, without)
    assert len({len(s["token_logits"]) for r in en.values() for s in r["samples"]}) > 1
    texts = [s["text"] for r in se.values() for s in r["samples"]]
    assert any(t != _squad_normalise(t) for t in texts)  # normalisation matters
    ind = independent_scores(run_root)[2]
    for m in ("mean_token_entropy", "ccp_lexical", "lexsim_rouge2", "eccentricity_jaccard"):
        assert np.std(ind[m]) > 0, m  # not a constant on this fixture
    assert np.any(ind["ccp_lexical"] != 1 - np.exp(-ind["logprob_sum"]))  # variants count


def test_report_aurocs_equal_sklearn_on_the_independent_scores(run_root, tmp_path, capsys):
    out = tmp_path / "eval"
    assert (
        main(
            [
                "evaluate",
                "--artifact-root",
                str(run_root),
                "--out",
                str(out),
                "--no-embeddings",
                "--no-plots",
                "--bootstrap",
                "50",
                "--methods",
                "logprob",
                "selfcheck",
                "semantic_entropy",
                "semantic_energy",
                "token_entropy",
                "ccp",
                "mc_entropy",
                "lexical_similarity",
                "graph",
                "eigenscore",
            ]
        )
        == 0
    )
    report = json.loads((out / "report.json").read_text())["methods"]
    for m, v in independent_aurocs(run_root).items():
        assert report[m]["auroc"] == pytest.approx(v, abs=1e-9), m
    ids, es = independent_eigenscore(run_root)
    table = read_scores(out / "scores.parquet")
    order = [table.prompt_ids.index(p) for p in ids]
    np.testing.assert_allclose(table.scores["eigenscore"][order], es, rtol=1e-6, atol=1e-9)
    assert report["eigenscore"]["auroc"] == pytest.approx(
        roc_auc_score(table.labels[order], es), abs=1e-9
    )


def test_density_and_subspace_probes_per_layer_as_the_docs_define(tmp_path):
    """Mahalanobis, relative Mahalanobis, HaloScope and SAPLMA: the out-of-fold AUROC at every
    layer equals a re-implementation (sklearn's LedoitWolf, an eigendecomposition, the MLP as
    documented; SAPLMA at its five layers only)."""
    root = make_run(tmp_path / "run", n=50, k=1, seed=8)
    out = tmp_path / "eval"
    assert (
        main(
            [
                "evaluate",
                "--artifact-root",
                str(root),
                "--out",
                str(out),
                "--no-plots",
                "--no-embeddings",
                "--bootstrap",
                "20",
                "--methods",
                "density",
                "subspace",
                "saplma",
            ]
        )
        == 0
    )
    per_layer = json.loads((out / "report.json").read_text())["per_layer"]
    for m in ("mahalanobis_last", "rel_mahalanobis_last", "haloscope_last", "saplma_last"):
        ours = per_layer[m]["auroc"]
        ind = independent_probe_per_layer(root, m)
        ours = np.array([np.nan if v is None else v for v in ours])
        np.testing.assert_allclose(ours, ind, rtol=0, atol=1e-9, err_msg=m)
        assert len(set(np.round(ind, 6))) > 1, m  # layers differ: the check can fail


@pytest.mark.parametrize("n", [12, 300])  # fewer rows than features (Woodbury), and more
def test_mahalanobis_equals_sklearn_ledoit_wolf(n):
    from hallulog.evaluation.probes import _gaussian, _mahalanobis
    from sklearn.covariance import LedoitWolf

    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, 40)) * rng.uniform(0.1, 3.0, 40)
    t = rng.standard_normal((25, 40))
    np.testing.assert_allclose(
        _mahalanobis(t, _gaussian(x)), LedoitWolf().fit(x).mahalanobis(t), rtol=1e-9
    )

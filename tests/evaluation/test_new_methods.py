"""The ICR-style probe, the layer-transition and question-token probes, the text-similarity
baselines and the UQLM-defined scores, each against a direct re-derivation of its definition
(docs/evaluation.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hallulog.evaluation.data import Run
from hallulog.evaluation.features import collect
from hallulog.evaluation.icr import icr_features, icr_scores
from hallulog.evaluation.methods import ALL_METHODS, resolve_methods
from hallulog.evaluation.probes import PROBES, middle_layers, probe_layers, run_probes, store_index
from hallulog.evaluation.protocol import auroc, make_split
from hallulog.evaluation.sample_methods import (
    consistency_confidence,
    exact_match_rate,
    monte_carlo_probability,
    probability_margin,
)
from hallulog.evaluation.text_similarity import tfidf_scores
from hallulog.storage import open_store
from sklearn.feature_extraction.text import TfidfVectorizer

from tests.evaluation.synthetic import make_run


def _icr_loop(h: np.ndarray) -> np.ndarray:
    """The ICR score as the paper's code computes it, one token and layer at a time, with the
    attention uniform over the rows up to the token (its attention_uniform ablation)."""
    L, m, _ = h.shape
    out = np.zeros((L - 1, m - 1))
    for layer in range(L - 1):
        for t in range(1, m):
            ctx = h[layer, : t + 1]
            delta = h[layer + 1, t] - h[layer, t]
            w = ctx @ delta / (np.linalg.norm(ctx, axis=1) + 1e-8)
            q = np.full(t + 1, 1.0 / (t + 1))

            def soft(v):
                v = (v - v.mean()) / max(v.std(ddof=1), 1e-8)
                e = np.exp(v - v.max())
                return e / e.sum()

            p, q = soft(w), soft(q)
            mid = 0.5 * (p + q)
            out[layer, t - 1] = (
                0.5 * (p * np.log(p / mid)).sum() + 0.5 * (q * np.log(q / mid)).sum()
            )
    return out


def test_icr_scores_equal_the_loop():
    rng = np.random.default_rng(0)
    h = rng.normal(size=(5, 7, 16)).cumsum(0)  # a residual stream: each layer adds to the last
    np.testing.assert_allclose(icr_scores(h), _icr_loop(h), rtol=1e-9, atol=1e-12)
    assert icr_scores(h[:, :1]).shape == (4, 0)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("new") / "run", n=40, k=3)


def test_icr_features_read_the_answer_rows(run):
    r = Run(run)
    feats = collect(r, set())
    _, _, rows = feats.arrays()
    reader = open_store(r.consolidated)
    try:
        idx = np.array([store_index(reader, k) for k in feats.activation_keys])
        x = icr_features(reader, idx, rows["tbg"], rows["last"], batch=7)
        p = 3
        h = reader.read_sample(int(idx[p]))[:, rows["tbg"][p] : rows["last"][p] + 1]
        np.testing.assert_allclose(x[p], icr_scores(h.astype(np.float64)).mean(1))
        assert x.shape == (40, reader.num_layers - 1) and np.isfinite(x).all()
    finally:
        reader.close()


def test_transition_probe_fits_the_layer_difference(run):
    r = Run(run)
    feats = collect(r, set())
    y, _, rows = feats.arrays()
    split = make_split(feats.prompt_ids, y, k=5)
    reader = open_store(r.consolidated)
    try:
        idx = np.array([store_index(reader, k) for k in feats.activation_keys])
        out = run_probes(reader, idx, rows, y, None, split, ["layer_transition_last"])
        res = out["layer_transition_last"]
        assert res["per_layer_auroc"][0] is None or math.isnan(res["per_layer_auroc"][0])
        # layer 2's probe is the logistic probe on row(2) - row(1), re-fitted here
        from hallulog.evaluation.probes import _fit_predict

        last = rows["last"]
        x = np.stack(
            [
                reader.read(int(i), 2)[last[p]].astype(np.float32)
                - reader.read(int(i), 1)[last[p]].astype(np.float32)
                for p, i in enumerate(idx)
            ]
        )
        oof = np.full(len(y), np.nan)
        for tr, te in split.folds():
            oof[te] = _fit_predict("logistic", x[tr], y[tr], x[te])
        assert res["per_layer_auroc"][2] == pytest.approx(auroc(y, oof), abs=1e-12)
    finally:
        reader.close()


def test_probe_layer_sets():
    assert probe_layers(PROBES["layer_transition_last"], 4) == {1, 2, 3}
    assert probe_layers(PROBES["question_mlp_tbg"], 31) == set(middle_layers(31))
    assert middle_layers(31) == [8, 11, 15, 19, 22]
    assert PROBES["question_logistic_tbg"].row == "tbg"
    fams = {m: f for m, f in ALL_METHODS.items()}
    for m in (
        "icr_probe",
        "layer_transition_last",
        "question_logistic_tbg",
        "question_mlp_tbg",
        "txtsim_tfidf",
        "txtsim_embedding",
    ):
        assert m in fams
    assert set(resolve_methods(["text_similarity"])[0]) == {"txtsim_tfidf", "txtsim_embedding"}


def test_tfidf_equals_sklearn(run):
    r = Run(run)
    ids, scores = tfidf_scores(r, chunk=7)
    assert ids == collect(r, set()).prompt_ids
    from hallulog.contracts.jsonl import iter_rows

    rows = [x for x in iter_rows(r.export_path("selfcheck")) if x.get("label") in (0, 1)]
    inputs = [x["prompt"] for x in rows]
    answers = [x["primary"]["text"] for x in rows]
    vec = TfidfVectorizer().fit(inputs + answers)
    a, b = vec.transform(inputs), vec.transform(answers)
    ref = 1.0 - np.asarray(a.multiply(b).sum(1)).ravel()
    np.testing.assert_allclose(scores, ref, atol=1e-12)


def test_uqlm_defined_scores():
    top = [
        [{"logprob": math.log(0.6)}, {"logprob": math.log(0.3)}],
        [{"logprob": math.log(0.9)}],  # one alternative: not counted
        [{"logprob": math.log(0.5)}, {"logprob": math.log(0.1)}, {"logprob": math.log(0.2)}],
    ]
    assert probability_margin(top) == pytest.approx(1 - np.mean([0.3, 0.3]))
    assert exact_match_rate("Paris", ["Paris", "paris", "Paris"]) == pytest.approx(1 - 2 / 3)
    assert math.isnan(monte_carlo_probability([-0.1, -1.0, None]))
    assert monte_carlo_probability([-0.1, -1.0]) == pytest.approx(1 - np.mean(np.exp([-0.1, -1.0])))
    e = np.eye(3)
    cc = consistency_confidence(e[0], np.stack([e[0], e[1]]), -0.5)
    assert cc == pytest.approx(1 - np.mean([1.0, 0.5]) * math.exp(-0.5))


def test_every_method_has_its_row_in_the_docs():
    """docs/evaluation.md's Methods table names every method evaluate scores (paper, definition,
    deviation), and every family in the --methods list."""
    from pathlib import Path

    from hallulog.evaluation.methods import FAMILIES

    doc = (Path(__file__).resolve().parents[2] / "docs" / "evaluation.md").read_text()
    table = doc[doc.index("## Methods") : doc.index("**Equal to another method.**")]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    named = {
        m for line in rows for m in line.split("|")[1].replace("`", "").replace(",", " ").split()
    }
    assert set(ALL_METHODS) <= named, sorted(set(ALL_METHODS) - named)
    head = doc[: doc.index("## Protocol")]
    assert all(f"`{f}`" in head for f in FAMILIES), [f for f in FAMILIES if f"`{f}`" not in head]

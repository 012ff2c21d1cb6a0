"""One question's page against the tables: its generations token by token with their
top-5 alternatives, the samples' clusters (the evaluation's exact-match rule) and every
detector's rank and percentile."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest
from hallulog.contracts import layout
from hallulog.evaluation.semantic_entropy import cluster_exact, discrete_entropy
from hallulog.view.index import QuestionIndex
from hallulog.view.question import load_question, read_rows, token_colour
from hallulog.view.run_files import open_run_files


@pytest.fixture(scope="module")
def index(synthetic_run):
    ix = QuestionIndex(open_run_files(synthetic_run))
    yield ix
    ix.close()


def test_generations_tokens_and_alternatives(index, synthetic_run):
    gens = pq.read_table(layout.consolidated_dir(synthetic_run) / layout.GENERATIONS_PARQUET)
    pid = gens.column("prompt_id")[4 * 123].as_py()  # K = 3: four rows a prompt
    mine = [g for g in gens.to_pylist() if g["prompt_id"] == pid]
    d = load_question(index, pid)
    assert d is not None and d.n == 123
    assert [g.sample_id for g in d.generations] == [g["sample_id"] for g in mine] == [0, 1, 2, 3]
    for view, row in zip(d.generations, mine):
        assert view.text == row["text"]
        assert [t.text for t in view.tokens] == row["tokens"]
        for t, lp, alt_t, alt_l in zip(
            view.tokens, row["token_logprobs"], row["top_logprob_tokens"], row["top_logprobs"]
        ):
            assert t.logprob == pytest.approx(lp)
            assert t.prob == pytest.approx(math.exp(lp))
            assert t.colour == token_colour(lp)
            assert [a.text for a in t.alternatives] == alt_t
            assert [a.logprob for a in t.alternatives] == pytest.approx(alt_l)


def test_clusters_follow_the_exact_match_rule(index, synthetic_run):
    gens = pq.read_table(layout.consolidated_dir(synthetic_run) / layout.GENERATIONS_PARQUET)
    pid = gens.column("prompt_id")[4 * 7].as_py()
    samples = [g["text"] for g in gens.to_pylist() if g["prompt_id"] == pid and g["sample_id"]]
    d = load_question(index, pid)
    ids = cluster_exact(samples)
    assert d.cluster_entropy == pytest.approx(discrete_entropy(ids))
    assert sorted(c.size for c in d.clusters) == sorted(np.bincount(ids).tolist())
    assert [g.cluster for g in d.generations[1:]] == ids


def test_detectors_percentiles_against_the_score_table(index, synthetic_run):
    scores = pq.read_table(layout.evaluation_dir(synthetic_run) / layout.SCORES).to_pandas()
    pid = scores["prompt_id"][10]
    d = load_question(index, pid)
    assert {c.method for c in d.detectors} == set(scores.columns) - {
        "prompt_id",
        "label",
        "fold",
        "test",
    }
    for c in d.detectors:
        v = scores[c.method].to_numpy()
        ok = v[np.isfinite(v)]
        x = scores.loc[10, c.method]
        if not np.isfinite(x):
            assert c.rank is None and c.percentile is None
            continue
        assert c.score == pytest.approx(x)
        assert c.rank == int((ok > x).sum()) + 1 and c.scored == len(ok)
        assert c.percentile == pytest.approx(100.0 * (ok <= x).sum() / len(ok))
    aurocs = [c.auroc for c in d.detectors]
    assert aurocs == sorted(aurocs, reverse=True)


def test_unknown_question_and_reference_fields(index, synthetic_run):
    assert load_question(index, "0" * 16) is None
    prompts = pq.read_table(layout.consolidated_dir(synthetic_run) / layout.PROMPTS_PARQUET)
    row = prompts.slice(5, 1).to_pylist()[0]
    d = load_question(index, row["prompt_id"])
    assert d.reference_answer == row["reference_answer"]
    assert d.reference_aliases == row["reference_aliases"]
    assert d.question == row["question"] and d.label == row["label"]
    assert d.label_source == "worker"


def test_read_rows_reads_across_row_groups(tmp_path):
    import pyarrow as pa

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": list(range(100))}), path, row_group_size=7)
    assert [r["x"] for r in read_rows(path, 5, 23, ["x"])] == list(range(5, 24))
    assert [r["x"] for r in read_rows(path, 99, 99, ["x", "absent"])] == [99]

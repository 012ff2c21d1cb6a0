"""The question index against the Parquet tables read independently (pyarrow, scipy): counts
per filter, ranks and percentiles, the "detectors disagree" rule, sort, search, paging."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from hallulog.contracts import layout
from hallulog.view.index import QuestionIndex
from hallulog.view.models import QuestionQuery
from hallulog.view.run_files import open_run_files
from scipy.stats import rankdata


@pytest.fixture(scope="module")
def index(synthetic_run):
    ix = QuestionIndex(open_run_files(synthetic_run))
    yield ix
    ix.close()


def _tables(root):
    prompts = pq.read_table(layout.consolidated_dir(root) / layout.PROMPTS_PARQUET).to_pylist()
    scores = pq.read_table(layout.evaluation_dir(root) / layout.SCORES).to_pandas()
    return prompts, scores.set_index("prompt_id")


def _expected_rank_pct(scores, method):
    v = scores[method].to_numpy()
    ok = np.isfinite(v)
    rank = rankdata(-v[ok], method="min")
    pct = 100.0 * rankdata(v[ok], method="max") / ok.sum()
    ids = scores.index[ok]
    return dict(zip(ids, rank)), dict(zip(ids, pct))


def test_counts_per_filter_match_the_labels(index, synthetic_run):
    prompts, _ = _tables(synthetic_run)
    page = index.page(QuestionQuery())
    labels = [p["label"] for p in prompts]
    assert page.counts["all"] == len(prompts) == index.size
    assert page.counts["hallucinated"] == labels.count(1)
    assert page.counts["correct"] == labels.count(0)
    assert page.counts["unlabelled"] == labels.count(None)
    for f in ("hallucinated", "correct", "unlabelled"):
        rows = index.page(QuestionQuery(filter=f, per_page=500)).rows
        want = {"hallucinated": 1, "correct": 0, "unlabelled": None}[f]
        assert len(rows) == page.counts[f] and {r.label for r in rows} <= {want}


def test_default_detectors_are_the_best_of_each_family(index, synthetic_run):
    report = open_run_files(synthetic_run).report
    best = {}
    for m, r in sorted(report["methods"].items(), key=lambda mr: (-mr[1]["auroc"], mr[0])):
        best.setdefault(r["family"], m)
    ranked = sorted(best.values(), key=lambda m: (-report["methods"][m]["auroc"], m))[:5]
    assert index.default_methods == ranked


def test_ranks_and_percentiles_match_scipy(index, synthetic_run):
    _, scores = _tables(synthetic_run)
    methods = ("sep_tbg", "logprob_min")  # sep_tbg has NaN scores
    rows = index.page(QuestionQuery(methods=methods, per_page=500)).rows
    assert len(rows) == 300
    for i, m in enumerate(methods):
        rank, pct = _expected_rank_pct(scores, m)
        for r in rows:
            cell = r.detectors[i]
            assert cell.method == m
            if r.prompt_id in rank:
                assert cell.rank == rank[r.prompt_id]
                assert cell.percentile == pytest.approx(pct[r.prompt_id], abs=1e-4)
                assert cell.score == pytest.approx(scores.loc[r.prompt_id, m])
            else:  # unlabelled, or no score of this method
                assert cell.rank is None and cell.percentile is None and cell.score is None


def test_disagree_filter_is_the_documented_rule(index, synthetic_run):
    _, scores = _tables(synthetic_run)
    methods = ("got_logistic_last", "selfcheck_unigram", "sep_tbg")
    pcts = [_expected_rank_pct(scores, m)[1] for m in methods]
    want = set()
    for pid in scores.index:
        values = [p[pid] for p in pcts if pid in p]
        if len(values) >= 2 and max(values) >= 75 and min(values) <= 25:
            want.add(pid)
    page = index.page(QuestionQuery(filter="disagree", methods=methods, per_page=500))
    assert {r.prompt_id for r in page.rows} == want and page.total == len(want) > 0
    assert all(r.disagree for r in page.rows)


def test_sort_by_a_score_and_page(index, synthetic_run):
    _, scores = _tables(synthetic_run)
    q = QuestionQuery(sort="logprob_mean", desc=True, per_page=40, methods=("logprob_mean",))
    seen = []
    for page in range(1, 9):
        seen += index.page(q.model_copy(update={"page": page})).rows
    assert len(seen) == 300 and len({r.prompt_id for r in seen}) == 300
    values = [r.detectors[0].score for r in seen if r.detectors[0].score is not None]
    assert values == sorted(scores["logprob_mean"].dropna(), reverse=True)
    assert all(r.detectors[0].score is None for r in seen[len(values) :])  # unscored last


def test_run_order_and_text_search(index, synthetic_run):
    prompts, _ = _tables(synthetic_run)
    first = index.page(QuestionQuery(per_page=10)).rows
    assert [r.prompt_id for r in first] == [p["prompt_id"] for p in prompts[:10]]
    assert [r.n for r in first] == list(range(10))
    hit = index.page(QuestionQuery(q="RIDDLE NUMBER 17?")).rows
    assert [r.question for r in hit] == ["Which city is meant by riddle number 17?"]
    by_id = index.page(QuestionQuery(q=prompts[42]["prompt_id"])).rows
    assert [r.n for r in by_id] == [42]
    assert index.page(QuestionQuery(q="no such text")).total == 0


def test_bad_sort_or_method_is_one_line(index):
    with pytest.raises(ValueError, match="sort 'nope': choose from"):
        index.page(QuestionQuery(sort="nope"))
    with pytest.raises(ValueError, match=r"methods \['nope'\] have no scores"):
        index.page(QuestionQuery(methods=("nope",)))


def test_without_evaluation_the_list_works_and_disagree_is_empty(unevaluated_run):
    ix = QuestionIndex(open_run_files(unevaluated_run))
    try:
        page = ix.page(QuestionQuery(filter="disagree"))
        assert (
            page.total == 0
            and page.methods == []
            and "hallulog evaluate" in (page.evaluation_missing or "")
        )
        assert ix.page(QuestionQuery()).total == 300
        assert ix.detectors({}) == []
    finally:
        ix.close()

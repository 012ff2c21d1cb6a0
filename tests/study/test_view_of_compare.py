"""``hallulog view STUDY`` over what ``hallulog compare`` writes (not a self-assembled study
root): the study page holds table.parquet's and transfer.parquet's numbers, the cells in
study.json's order, and the static export renders them."""

from __future__ import annotations

import json
import shutil

import pyarrow.parquet as pq
import pytest
from hallulog.contracts import layout
from hallulog.view.export import export_site
from hallulog.view.study import open_study, study_page


@pytest.fixture
def viewed(synthetic_study, compared, tmp_path):
    """A copy of the synthetic study with the compare output in its default STUDY/compare."""
    study = tmp_path / "study"
    shutil.copytree(synthetic_study, study, ignore=shutil.ignore_patterns("compare*"))
    shutil.copytree(compared.out, layout.compare_dir(study))
    return study


def test_the_study_page_reads_compare_output(viewed):
    files = open_study(viewed)
    page = study_page(files)
    compare = layout.compare_dir(viewed)
    manifest = [
        c["name"] for c in json.loads((viewed / layout.STUDY_MANIFEST).read_text())["cells"]
    ]
    assert [c.name for c in page.cells] == manifest and page.missing == []
    assert page.axes == ["model", "seed"]
    # a table given as {model, name} is shown by its name
    assert {c.name: c.axes["model"] for c in page.cells}["synthetic-3l__seed0"] == "synthetic-3l"
    table = pq.read_table(compare / layout.COMPARE_TABLE).to_pylist()
    assert table and {r["method"] for r in table} == set(page.methods)
    for r in table:
        v = page.table[r["cell"]][r["method"]]
        assert (v.auroc, v.auroc_lo, v.auroc_hi, v.prr, v.prr_lo, v.prr_hi) == pytest.approx(
            (r["auroc"], r["auroc_lo"], r["auroc_hi"], r["prr"], r["prr_lo"], r["prr_hi"]),
            nan_ok=True,
        )
        fpr = (v.fpr_at_95, v.fpr_at_95_lo, v.fpr_at_95_hi)
        want = (r["fpr_at_95"], r["fpr_at_95_lo"], r["fpr_at_95_hi"])
        assert [x if x is not None else float("nan") for x in fpr] == pytest.approx(
            want, nan_ok=True
        )
    grid = pq.read_table(compare / layout.COMPARE_TRANSFER).to_pylist()
    matrices = {t.method: t for t in page.transfer}
    assert set(matrices) == {g["method"] for g in grid}
    for g in grid:
        t = matrices[g["method"]]
        i, j = t.train.index(g["train_cell"]), t.test.index(g["test_cell"])
        assert t.auroc[i][j] == pytest.approx(g["auroc"], nan_ok=True)
    # cells of two models are never paired: their squares are empty on the page
    t = matrices["got_logistic_last"]
    i, j = t.train.index("synthetic__seed0"), t.test.index("synthetic-3l__seed0")
    assert t.auroc[i][j] is None


def test_the_export_of_a_compared_study_shows_its_table(viewed, tmp_path):
    out = tmp_path / "site"
    export_site(viewed, out)
    html = (out / "index.html").read_text()
    row = next(
        r
        for r in pq.read_table(layout.compare_dir(viewed) / layout.COMPARE_TABLE).to_pylist()
        if r["cell"] == "synthetic__seed1" and r["method"] == "logprob_min"
    )
    assert f"{row['auroc']:.3f}" in html and "got_logistic_last" in html
    assert 'id="compare-fpr95"' in html and f"{row['fpr_at_95']:.3f}" in html

"""A study root of two REAL small runs (K = 2, sample temperature 0.7 and 1.0) in a real
headless Chromium: the compare table as hallulog's own summarize_scores computes it from each
run's scores, the transfer matrix of a probe fitted on one run and scored on the other by
``hallulog evaluate --train-root`` (the diagonal: each run's own report), the cells linked to
their runs' pages, and back."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from hallulog.contracts import layout
from hallulog.view.app import create_app
from hallulog.view.server import ViewServer

from tests.view.conftest import REPO, real_run
from tests.view.study_root import make_study
from tests.view.view_browser import browser, missing_browser, table_cells, wait_for

pytestmark = [
    pytest.mark.browser,
    pytest.mark.e2e,
    pytest.mark.skipif(missing_browser() is not None, reason=str(missing_browser())),
]
PROBE = "got_logistic_last"


def _transfer_auroc(train, test, out) -> float:
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "evaluate", "--train-root", str(train),
         "--artifact-root", str(test), "--out", str(out), "--methods", "geometry",
         "--no-plots"],
        capture_output=True, text=True, cwd=REPO, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    auroc = json.loads((out / layout.REPORT_JSON).read_text())["methods"][PROBE]["auroc"]
    return math.nan if auroc is None else auroc


@pytest.fixture(scope="module")
def study(small_real_run, tmp_path_factory):
    base = tmp_path_factory.mktemp("view-study")
    hot = real_run(
        base / "t1.0",
        *("--limit", "6", "--k-samples", "2", "--max-tokens", "16"),
        *("--sample-temperature", "1.0"),
    )
    cells = {
        "T0.7": (small_real_run, {"sample_temperature": 0.7}),
        "T1.0": (hot, {"sample_temperature": 1.0}),
    }
    roots = {name: root for name, (root, _) in cells.items()}

    def transfer(method, train, test):
        if train == test:
            report = json.loads(
                (layout.evaluation_dir(roots[test]) / layout.REPORT_JSON).read_text()
            )
            value = report["methods"][method]["auroc"]
            return math.nan if value is None else value
        return _transfer_auroc(roots[train], roots[test], base / f"transfer_{train}_{test}")

    return make_study(base / "study", cells, transfer, [PROBE])


def test_study_page_and_its_cells(study):
    from selenium.webdriver.common.by import By

    table = pq.read_table(study / "compare" / "table.parquet").to_pylist()
    grid = pq.read_table(study / "compare" / "transfer.parquet").to_pylist()
    app = create_app(study)
    d = browser()
    try:
        with ViewServer(app) as srv:
            d.get(srv.url)
            wait_for(d, "#compare")
            shown = {
                (c["cell"], c["method"]): c
                for c in d.execute_script(
                    "return Array.from(document.querySelectorAll('#compare td[data-method]'))"
                    ".map(td => ({cell: td.parentElement.dataset.cell, method: td.dataset.method,"
                    " auroc: td.dataset.auroc, prr: td.dataset.prr}));"
                )
            }
            assert len(shown) == len(table)
            for r in table:
                c = shown[(r["cell"], r["method"])]
                assert float(c["auroc"] or "nan") == pytest.approx(r["auroc"], nan_ok=True)
                if r["prr"] is not None:
                    assert float(c["prr"]) == pytest.approx(r["prr"])
            cells = table_cells(d, ".transfer td[data-train]", "")
            assert len(cells) == len(grid) == 4
            for g in grid:
                c = next(
                    c for c in cells if (c["train"], c["test"]) == (g["train_cell"], g["test_cell"])
                )
                assert float(c["auroc"] or "nan") == pytest.approx(g["auroc"], nan_ok=True)
            assert d.execute_script(
                "return Array.from(document.images).every(i => i.complete && i.naturalWidth > 0);"
            )
            links = d.find_elements(By.CSS_SELECTOR, "a.cell-link")
            assert [a.text for a in links] == ["T0.7", "T1.0"]
            links[1].click()  # a cell's run
            wait_for(d, "#counts")
            want = pq.read_metadata(
                layout.consolidated_dir(study.parent / "t1.0") / layout.PROMPTS_PARQUET
            ).num_rows
            assert int(d.find_element(By.CSS_SELECTOR, "td[data-count='prompts']").text) == want
            d.find_element(By.ID, "nav-questions").click()
            wait_for(d, "#questions")
            d.find_elements(By.CSS_SELECTOR, "a.question-link")[0].click()
            wait_for(d, "#gen-0")
            d.find_element(By.ID, "nav-study").click()  # back to the study
            wait_for(d, "#compare")
    finally:
        d.quit()
        for site in app.state.sites.values():
            site.close()

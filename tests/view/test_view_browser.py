"""The explorer in a real headless Chromium on a REAL small run (the embedded SmolLM2, K = 2,
evaluated): every page opened by following links, a filter and a search applied, a token
hovered, and the numbers shown checked against the Parquet tables and scores.parquet; then the
static export opened from file:// and followed."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest
from hallulog.contracts import layout
from hallulog.view.app import create_app
from hallulog.view.export import export_site
from hallulog.view.server import ViewServer
from sklearn.metrics import roc_auc_score

from tests.view.view_browser import browser, hover, missing_browser, table_cells, wait_for

pytestmark = [
    pytest.mark.browser,
    pytest.mark.e2e,
    pytest.mark.skipif(missing_browser() is not None, reason=str(missing_browser())),
]
TOKEN = "view-browser-token"


def _tables(root):
    cons = layout.consolidated_dir(root)
    prompts = pq.read_table(cons / layout.PROMPTS_PARQUET).to_pylist()
    gens = pq.read_table(cons / layout.GENERATIONS_PARQUET).to_pylist()
    scores = pq.read_table(layout.evaluation_dir(root) / layout.SCORES).to_pandas()
    return prompts, gens, scores.set_index("prompt_id")


def _click(driver, css: str):
    from selenium.webdriver.common.by import By

    driver.find_element(By.CSS_SELECTOR, css).click()


def _check_run_page(d, root, prompts, gens, scores):
    import json

    report = json.loads((layout.evaluation_dir(root) / layout.REPORT_JSON).read_text())
    counts = {c["count"]: int(c["text"]) for c in table_cells(d, "#counts td[data-count]", "")}
    labels = [p["label"] for p in prompts]
    assert counts == {
        "prompts": len(prompts),
        "generations": len(gens),
        "labelled": len(prompts) - labels.count(None),
        "hallucinated": labels.count(1),
        "correct": labels.count(0),
        "unlabelled": labels.count(None),
    }
    ranking = table_cells(d, "#ranking tr[data-method]", "")
    assert {r["method"] for r in ranking} == set(report["methods"])
    for r in ranking:
        m = r["method"]
        shown = float(r["auroc"]) if r["auroc"] else math.nan
        want = report["methods"][m]["auroc"]
        assert shown == pytest.approx(math.nan if want is None else want, nan_ok=True)
        v = scores[m].to_numpy()
        ok = np.isfinite(v)
        if ok.sum() and len(set(scores["label"][ok])) == 2:  # recomputed from the scores
            assert shown == pytest.approx(roc_auc_score(scores["label"][ok], v[ok]))
    aurocs = [float(r["auroc"]) for r in ranking if r["auroc"]]
    assert aurocs == sorted(aurocs, reverse=True)
    layer_cells = table_cells(d, "#per-layer td[data-layer]", "")
    probe = report["per_layer"]["got_logistic_last"]
    mine = [c for c in layer_cells if c["text"] and float(c["layer"]) in probe["layer_ids"]]
    assert len(mine) >= len(probe["layer_ids"])
    loaded = d.execute_script(
        "return Array.from(document.images).map(i => i.complete && i.naturalWidth > 0);"
    )
    assert loaded and all(loaded)  # evaluate's PNGs, served by the app


def _check_question_rows(d, prompts, scores, want_label=None):
    rows = table_cells(d, "#questions tr[data-prompt-id]", "")
    by_id = {p["prompt_id"]: p for p in prompts}
    expected = [p for p in prompts if want_label is None or p["label"] == want_label]
    assert {r["promptId"] for r in rows} == {p["prompt_id"] for p in expected}
    for r in rows:
        lab = by_id[r["promptId"]]["label"]
        assert r["label"] == ("" if lab is None else str(lab))
    cells = table_cells(d, "#questions td[data-method]", "")
    assert cells
    row_of = {}
    for tr in d.execute_script(
        "return Array.from(document.querySelectorAll('#questions tr[data-prompt-id]'))"
        ".map(tr => [tr.dataset.promptId, Array.from(tr.querySelectorAll('td[data-method]'))"
        ".map(td => [td.dataset.method, td.dataset.score, td.dataset.percentile])]);"
    ):
        row_of[tr[0]] = tr[1]
    for pid, dets in row_of.items():
        for method, score, pct in dets:
            v = scores[method]
            x = v.get(pid, math.nan)
            if not np.isfinite(x):
                assert score == ""
                continue
            assert float(score) == pytest.approx(x)
            finite = v[np.isfinite(v)].to_numpy()
            assert float(pct) == pytest.approx(100 * (finite <= x).sum() / len(finite), abs=1e-4)
    return rows


def _check_question_page(d, pid, prompts, gens, scores):
    from selenium.webdriver.common.by import By

    wait_for(d, "#gen-0")
    p = next(p for p in prompts if p["prompt_id"] == pid)
    assert d.find_element(By.ID, "question").text == p["question"]
    assert d.find_element(By.ID, "reference").text == p["reference_answer"]
    mine = sorted((g for g in gens if g["prompt_id"] == pid), key=lambda g: g["sample_id"])
    for g in mine:
        toks = d.find_elements(By.CSS_SELECTOR, f"#gen-{g['sample_id']} .tok")
        assert len(toks) == len(g["tokens"])
        lps = [float(t.get_attribute("data-logprob")) for t in toks]
        assert lps == pytest.approx(g["token_logprobs"], abs=1e-6)
    tok = d.find_elements(By.CSS_SELECTOR, "#gen-0 .tok")[0]
    alts = tok.find_element(By.CSS_SELECTOR, ".alts")
    assert not alts.is_displayed()
    hover(d, tok)
    assert alts.is_displayed()
    texts = [c.text for c in alts.find_elements(By.CSS_SELECTOR, "td:first-child code")]
    want = [t.replace("\n", "⏎") for t in mine[0]["top_logprob_tokens"][0]]
    assert [t.strip() for t in texts] == [t.strip() for t in want] and len(texts) == 5
    entropy = d.find_element(By.ID, "cluster-entropy").get_attribute("data-value")
    if pid in scores.index:  # the page's clusters are the ones se_discrete_exact scored
        assert float(entropy) == pytest.approx(scores.loc[pid, "se_discrete_exact"])
    for c in table_cells(d, "#detectors tr[data-method]", ""):
        x = scores[c["method"]].get(pid, math.nan)
        if np.isfinite(x):
            finite = scores[c["method"]][np.isfinite(scores[c["method"]])].to_numpy()
            assert float(c["rank"]) == (finite > x).sum() + 1
            assert float(c["percentile"]) == pytest.approx(100 * (finite <= x).sum() / len(finite))


def test_every_page_of_a_real_run(small_real_run, tmp_path):
    from selenium.webdriver.common.by import By

    root = small_real_run
    prompts, gens, scores = _tables(root)
    app = create_app(root, token=TOKEN)
    d = browser()
    try:
        with ViewServer(app, token=TOKEN) as srv:
            d.get(srv.url)  # no session yet: the 401 page says how to sign in
            assert "login#token=TOKEN" in d.find_element(By.ID, "message").text
            d.get(srv.url + "login#token=" + TOKEN)  # the fragment never reaches the server
            wait_for(d, "#counts")
            assert "token" not in d.current_url
            _check_run_page(d, root, prompts, gens, scores)

            _click(d, "#nav-questions")
            wait_for(d, "#questions")
            _check_question_rows(d, prompts, scores)

            _click(d, "#filter-hallucinated")  # a filter
            wait_for(d, "#filter-hallucinated.here")
            rows = _check_question_rows(d, prompts, scores, want_label=1)
            assert int(d.find_element(By.ID, "filter-hallucinated").get_attribute("data-count"))
            assert len(rows) == sum(p["label"] == 1 for p in prompts)

            _click(d, "#filter-all")
            wait_for(d, "#filter-all.here")
            word = prompts[2]["question"].split()[-1].strip("?").lower()
            box = d.find_element(By.ID, "q")
            box.send_keys(word)
            box.submit()  # a text search
            wait_for(d, "#shown")
            found = {r["promptId"] for r in table_cells(d, "#questions tr[data-prompt-id]", "")}
            assert prompts[2]["prompt_id"] in found
            assert all(
                word in (p["question"] or "").lower() or word in (a or "").lower()
                for p in prompts
                if p["prompt_id"] in found
                for a in [next(g["text"] for g in gens if g["prompt_id"] == p["prompt_id"])]
            )

            _click(d, "#filter-all")
            wait_for(d, "#questions")
            first_method = d.find_elements(By.CSS_SELECTOR, "th.det a")[0]
            method = first_method.get_attribute("data-sort")
            first_method.click()  # sort by a detector, descending
            wait_for(d, "#questions")
            shown = [
                float(c["score"])
                for c in table_cells(d, f"#questions td[data-method='{method}']", "")
                if c["score"]
            ]
            assert shown == sorted(shown, reverse=True)

            link = d.find_elements(By.CSS_SELECTOR, "a.question-link")[0]
            pid = link.find_element(By.XPATH, "./ancestor::tr").get_attribute("data-prompt-id")
            link.click()
            _check_question_page(d, pid, prompts, gens, scores)
            _click(d, "#nav-run")
            wait_for(d, "#ranking")
    finally:
        d.quit()
        app.state.sites[""].close()


def test_static_export_opens_from_file(small_real_run, tmp_path):
    from selenium.webdriver.common.by import By

    prompts, gens, scores = _tables(small_real_run)
    out = tmp_path / "site"
    export_site(small_real_run, out, limit=6)
    d = browser()
    try:
        d.get((out / "index.html").as_uri())
        wait_for(d, "#counts")
        _check_run_page(d, small_real_run, prompts, gens, scores)
        _click(d, "#nav-questions")
        wait_for(d, "#questions")
        assert d.current_url.endswith("/questions-all-1.html")
        rows = table_cells(d, "#questions tr[data-prompt-id]", "")
        assert [r["promptId"] for r in rows] == [p["prompt_id"] for p in prompts]
        _click(d, "#filter-hallucinated")
        wait_for(d, "#filter-hallucinated.here")
        _check_question_rows(d, prompts, scores, want_label=1)
        link = d.find_elements(By.CSS_SELECTOR, "a.question-link")[0]
        pid = link.find_element(By.XPATH, "./ancestor::tr").get_attribute("data-prompt-id")
        link.click()
        assert d.current_url.startswith("file://")
        _check_question_page(d, pid, prompts, gens, scores)
        _click(d, "#nav-run")
        wait_for(d, "#ranking")
    finally:
        d.quit()

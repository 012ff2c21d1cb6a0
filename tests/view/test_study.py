"""A study root: the compare table and transfer matrices as the files hold them, cells linked
to their run pages (served under /cells/NAME/), a broken cell named on the page."""

from __future__ import annotations

import re

import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from hallulog.view.app import create_app
from hallulog.view.study import open_study, study_page

HTML = {"Accept": "text/html"}


def test_study_page_model_holds_the_files_numbers(synthetic_study):
    study = synthetic_study
    page = study_page(open_study(synthetic_study))
    table = pq.read_table(study / "compare" / "table.parquet").to_pylist()
    assert {c.name for c in page.cells} == {"k2 seed1", "k2/seed2"}
    assert [c.slug for c in page.cells] == ["k2_seed1", "k2_seed2"]
    for r in table:
        v = page.table[r["cell"]][r["method"]]
        assert (v.auroc, v.auroc_lo, v.auroc_hi, v.prr, v.prr_lo, v.prr_hi) == pytest.approx(
            (r["auroc"], r["auroc_lo"], r["auroc_hi"], r["prr"], r["prr_lo"], r["prr_hi"])
        )
    (t,) = page.transfer
    assert t.method == "got_logistic_last" and t.train == t.test == ["k2 seed1", "k2/seed2"]
    grid = pq.read_table(study / "compare" / "transfer.parquet").to_pylist()
    for g in grid:
        i, j = t.train.index(g["train_cell"]), t.test.index(g["test_cell"])
        assert t.auroc[i][j] == pytest.approx(g["auroc"])
    assert page.plots == ["transfer_got_logistic_last.png"] and page.axes == ["seed", "k"]


def test_study_served_with_cells_linked_to_their_runs(synthetic_study):
    app = create_app(synthetic_study)
    with TestClient(app) as c:
        home = c.get("/", headers=HTML)
        assert home.status_code == 200
        links = re.findall(r'class="cell-link" href="([^"]+)"', home.text)
        assert links == ["cells/k2_seed1/", "cells/k2_seed2/"]
        run = c.get("/" + links[1], headers=HTML)
        assert run.status_code == 200 and 'href="../../"' in run.text  # back to the study
        assert c.get("/cells/k2_seed2/api/run").json()["counts"]["prompts"] == 90
        assert c.get("/cells/k2_seed2", follow_redirects=False).status_code in (307, 308)
        assert c.get("/cells/nope/api/run").status_code == 404
        assert c.get("/compare/transfer_got_logistic_last.png").content[:4] == b"\x89PNG"
        pid = c.get("/cells/k2_seed1/api/questions").json()["rows"][0]["prompt_id"]
        q = c.get(f"/cells/k2_seed1/q/{pid}", headers=HTML)
        assert q.status_code == 200 and 'href="../../../"' in q.text
    for site in app.state.sites.values():
        site.close()


def test_a_cell_without_its_run_is_named(synthetic_study, tmp_path):
    study = synthetic_study
    import json
    import shutil

    root = tmp_path / "study"
    shutil.copytree(study, root)
    doc = json.loads((root / "study.json").read_text())
    doc["cells"].append(
        {"name": "lost", "values": {"seed": 3, "task": {"task": "qa", "task_path": "x.csv"}},
         "root": str(tmp_path / "gone")}
    )  # fmt: skip
    (root / "study.json").write_text(json.dumps(doc))
    (root / "compare" / "transfer.parquet").unlink()
    page = study_page(open_study(root))
    lost = [c for c in page.cells if c.name == "lost"][0]
    assert "no such directory" in lost.problem and page.transfer == []
    assert lost.axes == {"seed": "3", "task": "task=qa, task_path=x.csv"}
    app = create_app(root)
    with TestClient(app) as c:
        assert c.get("/cells/lost/", headers=HTML).status_code == 404
        assert "no such directory" in c.get("/", headers=HTML).text

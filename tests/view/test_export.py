"""The static export: every link of every page resolves to an exported file, each filter holds
its first N questions in run order, a study exports its cells under cells/<cell>/."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hallulog.contracts import layout
from hallulog.view.export import PER_PAGE, export_site


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("href", "src") and value:
                self.links.append(value)


def _links(page: Path) -> list[str]:
    p = _Links()
    p.feed(page.read_text(encoding="utf-8"))
    return p.links


def _check_links(out: Path) -> int:
    pages = list(out.rglob("*.html"))
    for page in pages:
        for link in _links(page):
            assert not re.match(r"^(/|[a-z]+:)", link), f"{page}: non-relative link {link}"
            assert (page.parent / link).resolve().is_file(), f"{page}: {link} not exported"
    return len(pages)


def test_export_of_a_run(synthetic_run, tmp_path):
    out = tmp_path / "site"
    done = export_site(synthetic_run, out, limit=12, per_page=5)
    assert (out / "index.html").is_file()
    n_pages = _check_links(out)
    prompts = pq.read_table(layout.consolidated_dir(synthetic_run) / layout.PROMPTS_PARQUET)
    labels = prompts.column("label").to_pylist()
    ids = prompts.column("prompt_id").to_pylist()
    hallucinated = [p for p, lab in zip(ids, labels) if lab == 1][:12]
    shown = []
    for page in (1, 2, 3):
        text = (out / f"questions-hallucinated-{page}.html").read_text()
        shown += re.findall(r'data-prompt-id="([0-9a-f]{16})"', text)
    assert shown == hallucinated and not (out / "questions-hallucinated-4.html").exists()
    assert PER_PAGE == 50 and len(shown) == 12
    assert done["questions"] == len(list((out / "q").glob("*.html")))
    assert n_pages == 1 + done["list_pages"] + done["questions"]
    assert "Static export: the first 12 questions" in (out / "questions-all-1.html").read_text()
    assert 'id="search"' not in (out / "questions-all-1.html").read_text()


def test_export_limit_must_be_positive(synthetic_run, tmp_path):
    with pytest.raises(ValueError, match="--export-limit must be >= 1"):
        export_site(synthetic_run, tmp_path / "x", limit=0)


def test_export_of_a_study(synthetic_study, tmp_path):
    out = tmp_path / "site"
    done = export_site(synthetic_study, out, limit=4, per_page=2)
    assert done["cells"] == 2
    _check_links(out)
    assert (out / "cells" / "k2_seed1" / "index.html").is_file()
    assert (out / "compare" / "transfer_got_logistic_last.png").is_file()
    assert 'href="../../index.html"' in (out / "cells" / "k2_seed2" / "index.html").read_text()

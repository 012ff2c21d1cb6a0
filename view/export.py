"""``hallulog view ROOT --export DIR``: the same pages as static HTML files, relative links
only, so ``DIR/index.html`` opens from disk (``file://``) or any static host.

Bounded: each filter's list holds its first ``limit`` questions in run order (pages of
:data:`PER_PAGE`), and a page is written for every question those lists show. Sorting, search
and the choice of detectors need the server; the export shows the default detectors. A study
root exports its page and each cell's run under ``cells/<cell>/``.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from urllib.parse import quote

from hallulog.view.defaults import DEFAULT_EXPORT_LIMIT, DEFAULT_MEMORY_LIMIT
from hallulog.view.index import QuestionIndex
from hallulog.view.models import FILTERS, QuestionQuery
from hallulog.view.question import load_question
from hallulog.view.render import Links, render
from hallulog.view.run_files import open_run_files
from hallulog.view.study import is_study, open_study, study_page
from hallulog.view.summary import run_summary

__all__ = ["export_site", "PER_PAGE"]

PER_PAGE = 50


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _export_run(
    root: Path, out: Path, *, limit: int, per_page: int, study_depth: int | None, options: dict
) -> dict[str, int]:
    index = QuestionIndex(open_run_files(root), **options)
    try:
        summary = run_summary(index)
        title = f"{summary.model or 'run'} · {summary.dataset or ''}"
        top = Links(static=True, study_depth=study_depth)
        _write(out / "index.html", render("run.html", links=top, title=title, run=summary))
        for name, path in index.files.plots.items():
            (out / "plots").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, out / "plots" / name)
        shown: dict[str, None] = {}
        pages = 0
        for f in FILTERS:
            first = index.page(QuestionQuery(filter=f, per_page=per_page))
            count = min(limit, first.total)
            last = max(1, math.ceil(count / per_page))
            for p in range(1, last + 1):
                page = first if p == 1 else index.page(first.query.model_copy(update={"page": p}))
                rows = page.rows[: max(0, count - (p - 1) * per_page)]
                page = page.model_copy(update={"rows": rows, "pages": last})
                shown.update(dict.fromkeys(r.prompt_id for r in rows))
                body = render(
                    "questions.html",
                    links=top,
                    title=f"questions · {title}",
                    page=page,
                    static=True,
                    exported=FILTERS,
                    limit=limit,
                )
                _write(out / f"questions-{f}-{p}.html", body)
                pages += 1
        deep = Links(static=True, depth=1, study_depth=study_depth)
        for pid in shown:
            detail = load_question(index, pid)
            if detail is not None:
                body = render(
                    "question.html", links=deep, title=detail.question or pid, question=detail
                )
                _write(out / "q" / f"{quote(pid, safe='')}.html", body)
        return {"list_pages": pages, "questions": len(shown)}
    finally:
        index.close()


def export_site(
    root: Path | str,
    out: Path | str,
    *,
    limit: int = DEFAULT_EXPORT_LIMIT,
    per_page: int = PER_PAGE,
    memory_limit: str = DEFAULT_MEMORY_LIMIT,
    threads: int = 2,
) -> dict[str, int]:
    """Write the pages of a run or study root into ``out``; returns what was written."""
    if limit < 1:
        raise ValueError(f"--export-limit must be >= 1, got {limit}")
    root, out = Path(root), Path(out)
    options = {"memory_limit": memory_limit, "threads": threads}
    if not is_study(root):
        return _export_run(
            root, out, limit=limit, per_page=per_page, study_depth=None, options=options
        )
    study = open_study(root)
    page = study_page(study)
    _write(
        out / "index.html",
        render("study.html", links=Links(static=True), title="study", study=page),
    )
    for name, path in study.plots.items():
        (out / "compare").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, out / "compare" / name)
    totals = {"cells": 0, "list_pages": 0, "questions": 0}
    for cell in page.cells:
        if cell.problem is not None:
            continue
        done = _export_run(
            study.roots[cell.slug],
            out / "cells" / cell.slug,
            limit=limit,
            per_page=per_page,
            study_depth=2,
            options=options,
        )
        totals["cells"] += 1
        totals["list_pages"] += done["list_pages"]
        totals["questions"] += done["questions"]
    return totals

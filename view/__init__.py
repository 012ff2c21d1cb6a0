"""``hallulog view``: the results explorer of a finished run (or a study) in the browser, on
FastAPI/uvicorn under the status API's token rules, its question tables queried by DuckDB a
page at a time; ``--export`` writes the same pages as static HTML (docs/view.md).

Layout: ``models.py`` (wire models), ``run_files.py`` / ``index.py`` / ``summary.py`` /
``question.py`` / ``study.py`` (logic), ``render.py`` + ``templates/`` (HTML), ``app.py``
(routes), ``auth.py`` (token and session), ``server.py`` (uvicorn), ``export.py`` (static
files), ``command.py`` (the subcommand), ``defaults.py``. The names below are imported on
first use, so ``hallulog --help`` loads none of FastAPI, DuckDB or Jinja2.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "create_app",
    "ViewServer",
    "export_site",
    "QuestionIndex",
    "open_run_files",
    "ViewInputError",
]

_WHERE = {
    "create_app": "app",
    "ViewServer": "server",
    "export_site": "export",
    "QuestionIndex": "index",
    "open_run_files": "run_files",
    "ViewInputError": "run_files",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'hallulog.view' has no attribute {name!r}")
    return getattr(importlib.import_module(f"hallulog.view.{_WHERE[name]}"), name)

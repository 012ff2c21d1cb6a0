"""HTML of every page: Jinja2 templates (``view/templates/``, autoescaped, no CDN: the CSS and
the few lines of script are inline) and the links between pages.

Links are relative, so the same templates serve a run at ``/``, a study's cell at
``/cells/NAME/`` and the static export's files: :class:`Links` knows how deep a page sits and
whether it is served (``questions?filter=...``) or exported (``questions-FILTER-PAGE.html``).
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from hallulog.view.index import DISAGREE_HIGH, DISAGREE_LOW
from hallulog.view.models import FILTERS, QuestionQuery

__all__ = ["Links", "render", "DISAGREE_RULE"]

DISAGREE_RULE = (
    f"Detectors disagree on a question when, among the detectors shown, one puts it at "
    f"percentile ≥ {DISAGREE_HIGH:.0f} (its most suspicious quarter of the run) and another "
    f"at percentile ≤ {DISAGREE_LOW:.0f} (its least suspicious quarter). Percentile = 100 × "
    f"the share of the run's scored questions whose score is ≤ this one's."
)

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("hallulog.view", "templates"),
    autoescape=jinja2.select_autoescape(["html"]),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


class Links:
    """Relative links from one page: ``depth`` folders below its run's root (0 for the run,
    questions and study pages, 1 for a question's); ``study_depth`` folders from the run's root
    up to its study's (None: not in a study); ``static`` for the exported files."""

    def __init__(self, *, static: bool, depth: int = 0, study_depth: int | None = None):
        self.static = static
        self.up = "../" * depth
        self.study_up = None if study_depth is None else self.up + "../" * study_depth

    def run(self) -> str:
        return self.up + "index.html" if self.static else (self.up or "./")

    def questions(self, query: QuestionQuery | None = None, **changes: Any) -> str:
        q = (query or QuestionQuery()).model_copy(update=changes)
        if self.static:
            return f"{self.up}questions-{q.filter}-{q.page}.html"
        default = QuestionQuery()
        params: list[tuple[str, Any]] = []
        for name in ("filter", "q", "sort", "desc", "page", "per_page"):
            value = getattr(q, name)
            if value != getattr(default, name):
                params.append((name, str(value).lower() if isinstance(value, bool) else value))
        params += [("methods", m) for m in q.methods]
        return f"{self.up}questions" + (f"?{urlencode(params)}" if params else "")

    def question(self, prompt_id: str) -> str:
        name = quote(prompt_id, safe="")
        return f"{self.up}q/{name}.html" if self.static else f"{self.up}q/{name}"

    def plot(self, name: str) -> str:
        return f"{self.up}plots/{quote(name)}"

    def study(self) -> str | None:
        if self.study_up is None:
            return None
        return self.study_up + "index.html" if self.static else self.study_up

    def cell(self, slug: str) -> str:
        """From the study page: a cell's run page."""
        return f"cells/{quote(slug)}/index.html" if self.static else f"cells/{quote(slug)}/"

    def study_plot(self, name: str) -> str:
        return f"compare/{quote(name)}"


def _num(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:.{digits}f}"


def _interval(lo: Any, hi: Any, digits: int = 3) -> str:
    if lo is None or hi is None:
        return ""
    return f"[{_num(lo, digits)}, {_num(hi, digits)}]"


def _auroc_colour(v: Any) -> str:
    """Heat of an AUROC: white at 0.5, green towards 1, red towards 0."""
    if v is None or not math.isfinite(v):
        return "transparent"
    x = max(-1.0, min(1.0, (v - 0.5) * 2))
    hue = 130 if x >= 0 else 0
    return f"hsl({hue}, 60%, {100 - 38 * abs(x):.0f}%)"


def _label(v: Any) -> str:
    return {1: "hallucinated", 0: "correct"}.get(v, "unlabelled")


def _full(v: Any) -> str:
    """A number as data attribute: full precision (repr), empty for none."""
    return "" if v is None else repr(v)


_ENV.filters.update(num=_num, interval=_interval, auroc_colour=_auroc_colour, label=_label)
_ENV.filters["full"] = _full
_ENV.globals.update(FILTERS=FILTERS, DISAGREE_RULE=DISAGREE_RULE)


def render(template: str, *, links: Links, title: str, **context: Any) -> str:
    return _ENV.get_template(template).render(links=links, title=title, **context)

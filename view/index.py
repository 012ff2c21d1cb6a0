"""The question index: a run's questions as one DuckDB table, queried a page at a time.

Opening a run builds, from the Parquet files and without holding them in Python, one DuckDB
table ``b`` of a row per prompt: its row in ``prompts.parquet`` (``n``, the run order), id,
question, primary answer, label, grader status, the row range of its generations in
``generations.parquet`` (``g0``..``g1``, for the question page) and every method's score from
``evaluation/scores.parquet`` (NaN read as NULL). DuckDB holds it under ``memory_limit`` and
spills to a temporary directory beyond that, so the Python process holds a page, never the run.

Ranks and percentiles of the detectors a page shows are computed with numpy for that set of
detectors once (a sort per method) into a small table ``v_i`` (``n``, rank and percentile per
method, ``disagree``), cached for the next pages.

Definitions (docs/view.md):

- rank of a question for a method: 1 + the number of scored questions with a higher score
  (1 = the most suspicious; ties share the better rank);
- percentile: 100 × the share of the scored questions whose score is ≤ this one's;
- "detectors disagree": among the detectors compared (the ones shown), at least one puts the
  question at percentile ≥ 75 (its most suspicious quarter) and another at ≤ 25 (its least
  suspicious quarter).
"""

from __future__ import annotations

import math
import tempfile
import threading
from collections import OrderedDict
from typing import Any

import numpy as np
from hallulog.contracts.extras import require
from hallulog.view.defaults import DEFAULT_MEMORY_LIMIT
from hallulog.view.models import DetectorCell, QuestionPage, QuestionQuery, QuestionRow
from hallulog.view.run_files import RunFiles, ViewInputError

__all__ = [
    "QuestionIndex",
    "default_methods",
    "DISAGREE_HIGH",
    "DISAGREE_LOW",
    "DEFAULT_DETECTORS",
]

DISAGREE_HIGH = 75.0
DISAGREE_LOW = 25.0
DEFAULT_DETECTORS = 5
"""The default detectors: the best method (AUROC; ties: the first name) of each family, the five
best families."""
_FIXED_SORTS = {
    "n": "b.n",
    "prompt_id": "b.prompt_id",
    "label": "b.label",
    "status": "b.label_status",
    "question": "b.question",
}
_FILTER_SQL = {
    "all": "TRUE",
    "hallucinated": "b.label = 1",
    "correct": "b.label = 0",
    "unlabelled": "b.label IS NULL",
    "disagree": "v.disagree",
}
_SCORE_META = ("prompt_id", "label", "fold", "test")
_TEXT_CHARS = 300  # question and answer as the list shows them
_TEXT_KEPT = 1000  # ... as the index keeps them (and the search looks into them): bounded rows
_CACHED_SETS = 8
_CACHED_COUNTS = 256


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _finite(v: Any) -> float | None:
    return None if v is None or not math.isfinite(float(v)) else float(v)


def default_methods(report: dict | None, available: list[str]) -> list[str]:
    """The best method of each family by AUROC, the :data:`DEFAULT_DETECTORS` best families."""
    best: dict[str, tuple[float, str]] = {}
    for name, r in ((report or {}).get("methods") or {}).items():
        auroc = _finite(r.get("auroc"))
        if name not in available or auroc is None:
            continue
        family = r.get("family") or name
        if family not in best or (-auroc, name) < (-best[family][0], best[family][1]):
            best[family] = (auroc, name)  # ties: the first name
    ranked = sorted(best.values(), key=lambda t: (-t[0], t[1]))
    return [name for _, name in ranked[:DEFAULT_DETECTORS]]


class QuestionIndex:
    """The question table of one run (see the module docstring); thread-safe."""

    def __init__(
        self, files: RunFiles, *, memory_limit: str = DEFAULT_MEMORY_LIMIT, threads: int = 2
    ):
        duckdb = require("duckdb", "hallulog view")
        self.files = files
        self._tmp = tempfile.TemporaryDirectory(prefix="hallulog-view-")
        self._con = duckdb.connect(
            ":memory:",
            config={
                "memory_limit": memory_limit,
                "threads": threads,
                "temp_directory": self._tmp.name,
            },
        )
        self._lock = threading.Lock()
        self._sets: OrderedDict[tuple[str, ...], str] = OrderedDict()
        self._set_counter = 0
        self._counted: OrderedDict[tuple[str | None, str], dict[str, int]] = OrderedDict()
        report = files.report or {}
        self.methods: list[str] = self._score_columns()
        self.family: dict[str, str | None] = {
            m: ((report.get("methods") or {}).get(m) or {}).get("family") for m in self.methods
        }
        self.auroc: dict[str, float | None] = {
            m: _finite(((report.get("methods") or {}).get(m) or {}).get("auroc"))
            for m in self.methods
        }
        self.default_methods = default_methods(report, self.methods)
        try:
            self._build()
        except duckdb.Error as exc:  # a truncated or foreign file: one line naming the run
            self.close()
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ViewInputError(
                f"{files.root}: its Parquet tables cannot be read ({first}); rerun "
                f"`hallulog consolidate --artifact-root {files.root}`"
            ) from None
        self.size = int(self._con.execute("SELECT count(*) FROM b").fetchone()[0])
        if self.default_methods:
            self._ranked(tuple(self.default_methods))

    # ---- building ------------------------------------------------------------------------
    def _score_columns(self) -> list[str]:
        if self.files.scores is None:
            return []
        import json

        import pyarrow.parquet as pq

        schema = pq.read_schema(self.files.scores)
        # the method columns: named in the file's metadata (beside them the guard columns,
        # ``leaked`` and ``label_<grader>``); files written before it hold methods only
        meta = json.loads((schema.metadata or {}).get(b"hallulog.scores", b"{}"))
        if meta.get("methods"):
            return [n for n in meta["methods"] if n in schema.names]
        return [n for n in schema.names if n not in _SCORE_META]

    def _build(self) -> None:
        gens = _literal(str(self.files.generations))
        prompts = _literal(str(self.files.prompts))
        scores_sel, scores_join = "", ""
        if self.methods:
            scores_sel = ", " + ", ".join(
                f"CASE WHEN isnan(s.{_ident(m)}) THEN NULL ELSE s.{_ident(m)} END AS {_ident(m)}"
                for m in self.methods
            )
            scores_join = (
                f"LEFT JOIN read_parquet({_literal(str(self.files.scores))}) s USING (prompt_id)"
            )
        self._con.execute(
            f"""CREATE TABLE b AS
            WITH g AS (
                SELECT prompt_id, min(file_row_number) AS g0, max(file_row_number) AS g1,
                       any_value(text) FILTER (WHERE sample_id = 0) AS answer
                FROM read_parquet({gens}, file_row_number = true) GROUP BY prompt_id)
            SELECT p.file_row_number::INTEGER AS n, p.prompt_id,
                   left(coalesce(p.question, p.prompt), {_TEXT_KEPT}) AS question,
                   left(g.answer, {_TEXT_KEPT}) AS answer,
                   p.label::INTEGER AS label, p.label_status, p.label_grader,
                   g.g0, g.g1 {scores_sel}
            FROM read_parquet({prompts}, file_row_number = true) p
            LEFT JOIN g USING (prompt_id) {scores_join}"""
        )

    def _ranked(self, methods: tuple[str, ...]) -> str:
        """The table of ranks and percentiles of ``methods`` (built once per set)."""
        with self._lock:
            if methods in self._sets:
                self._sets.move_to_end(methods)
                return self._sets[methods]
            import pyarrow as pa

            cur = self._con.cursor()
            cols = ", ".join(_ident(m) for m in methods)
            t = cur.sql(f"SELECT n, {cols} FROM b ORDER BY n").to_arrow_table()
            out = {"n": t.column("n")}
            pcts = []
            for i, m in enumerate(methods):
                rank, pct = _rank_pct(t.column(m).to_numpy(zero_copy_only=False))
                ok = np.isfinite(pct)
                out[f"r{i}"] = pa.array(rank, mask=~ok)
                out[f"p{i}"] = pa.array(pct.astype(np.float32), mask=~ok)
                pcts.append(pct)
            out["disagree"] = pa.array(_disagree(pcts, len(t)))
            name = f"v_{self._set_counter}"
            self._set_counter += 1
            cur.register("ranked_arrow", pa.table(out))
            cur.execute(f"CREATE TABLE {name} AS SELECT * FROM ranked_arrow")
            cur.unregister("ranked_arrow")
            self._sets[methods] = name
            while len(self._sets) > _CACHED_SETS:
                _, old = self._sets.popitem(last=False)
                cur.execute(f"DROP TABLE {old}")
            cur.close()
            return name

    # ---- queries -------------------------------------------------------------------------
    def shown(self, query: QuestionQuery) -> list[str]:
        unknown = [m for m in query.methods if m not in self.methods]
        if unknown:
            raise ValueError(
                f"methods {unknown} have no scores in this run; choose from {self.methods}"
            )
        return list(dict.fromkeys(query.methods)) or list(self.default_methods)

    def page(self, query: QuestionQuery) -> QuestionPage:
        methods = self.shown(query)
        if query.sort not in _FIXED_SORTS and query.sort not in self.methods:
            raise ValueError(
                f"sort {query.sort!r}: choose from {sorted(_FIXED_SORTS)} or a method's name"
            )
        vt = self._ranked(tuple(methods)) if methods else None
        where, params = self._search(query.q)
        order = _FIXED_SORTS.get(query.sort) or f"b.{_ident(query.sort)}"
        direction = "DESC" if query.desc else "ASC"
        cur = self._con.cursor()
        try:
            counts = self._counts(cur, vt, query.q)
            total = counts[query.filter]
            flt = _FILTER_SQL[query.filter] if (vt or query.filter != "disagree") else "FALSE"
            # two steps: the page's rows by their sort key alone (a top-N over a few columns),
            # then the shown columns of those 50 rows
            need_v = vt is not None and query.filter == "disagree"
            ids = cur.execute(
                f"""SELECT b.n FROM b {f"JOIN {vt} v USING (n)" if need_v else ""}
                WHERE {flt} AND {where}
                ORDER BY {order} {direction} NULLS LAST, b.n LIMIT ? OFFSET ?""",
                [*params, query.per_page, (query.page - 1) * query.per_page],
            ).fetchall()
            ns = [r[0] for r in ids]
            per = [f"b.{_ident(m)}, v.r{i}, v.p{i}" for i, m in enumerate(methods)]
            extra = (", " + ", ".join(per) + ", v.disagree") if vt else ""
            found = cur.execute(
                f"""SELECT b.n, b.prompt_id, left(b.question, {_TEXT_CHARS}),
                       left(b.answer, {_TEXT_CHARS}), b.label, b.label_status,
                       b.label_grader {extra}
                FROM b {f"JOIN {vt} v USING (n)" if vt else ""} WHERE b.n = ANY(?)""",
                [ns],
            ).fetchall()
        finally:
            cur.close()
        by_n = {r[0]: r for r in found}
        rows = [by_n[n] for n in ns]
        return QuestionPage(
            query=query,
            rows=[self._row(r, methods) for r in rows],
            total=total,
            pages=max(1, math.ceil(total / query.per_page)),
            counts=counts,
            methods=methods,
            default_methods=self.default_methods,
            all_methods=self.methods,
            evaluation_missing=self.files.evaluation_missing,
        )

    @staticmethod
    def _search(q: str) -> tuple[str, list[Any]]:
        text = q.strip().lower()
        if not text:
            return "TRUE", []
        return (
            "(contains(lower(b.question), ?) OR contains(lower(b.answer), ?) OR b.prompt_id = ?)",
            [text, text, text],
        )

    def _counts(self, cur, vt: str | None, q: str) -> dict[str, int]:
        """Questions per filter with the search ``q`` applied (cached per detector set and
        search: the run does not change under the server)."""
        key = (vt, q.strip().lower())
        with self._lock:
            if key in self._counted:
                self._counted.move_to_end(key)
                return self._counted[key]
        where, params = self._search(q)
        parts = [
            f"count(*) FILTER (WHERE {_FILTER_SQL[f]})"
            for f in ("all", "hallucinated", "correct", "unlabelled")
        ]
        parts.append(f"count(*) FILTER (WHERE {_FILTER_SQL['disagree']})" if vt else "0")
        join = f"JOIN {vt} v USING (n)" if vt else ""
        row = cur.execute(f"SELECT {', '.join(parts)} FROM b {join} WHERE {where}", params)
        counts = dict(
            zip(("all", "hallucinated", "correct", "unlabelled", "disagree"), row.fetchone())
        )
        with self._lock:
            self._counted[key] = counts
            while len(self._counted) > _CACHED_COUNTS:
                self._counted.popitem(last=False)
        return counts

    def _row(self, r: tuple, methods: list[str]) -> QuestionRow:
        cells = []
        for i, m in enumerate(methods):
            score, rank, pct = r[7 + 3 * i : 10 + 3 * i]
            cells.append(
                DetectorCell(
                    method=m,
                    family=self.family.get(m),
                    auroc=self.auroc.get(m),
                    score=_finite(score),
                    rank=rank,
                    percentile=_finite(pct),
                )
            )
        return QuestionRow(
            n=r[0],
            prompt_id=r[1],
            question=r[2],
            answer=r[3],
            label=r[4],
            label_status=r[5],
            label_grader=r[6],
            detectors=cells,
            disagree=r[7 + 3 * len(methods)] if methods else None,
        )

    def locate(self, prompt_id: str) -> dict[str, Any] | None:
        """``n``, ``g0``, ``g1`` and every score of one question; None for an unknown id."""
        cur = self._con.cursor()
        try:
            cols = "".join(f", {_ident(m)}" for m in self.methods)
            row = cur.execute(
                f"SELECT n, g0, g1{cols} FROM b WHERE prompt_id = ?", [prompt_id]
            ).fetchone()
        finally:
            cur.close()
        if row is None:
            return None
        return {"n": row[0], "g0": row[1], "g1": row[2], "scores": dict(zip(self.methods, row[3:]))}

    def detectors(self, scores: dict[str, float | None]) -> list[DetectorCell]:
        """Every method's score of one question with its rank and percentile in the run."""
        if not self.methods:
            return []
        parts, params = [], []
        for m in self.methods:
            c = _ident(m)
            x = _finite(scores.get(m))
            parts.append(f"count({c})")
            if x is None:
                parts += ["NULL", "NULL"]
                continue
            parts += [f"count(*) FILTER (WHERE {c} > ?)", f"count(*) FILTER (WHERE {c} <= ?)"]
            params += [x, x]
        cur = self._con.cursor()
        try:
            row = cur.execute(f"SELECT {', '.join(parts)} FROM b", params).fetchone()
        finally:
            cur.close()
        out = []
        for i, m in enumerate(self.methods):
            scored, above, at_most = row[3 * i : 3 * i + 3]
            x = _finite(scores.get(m))
            out.append(
                DetectorCell(
                    method=m,
                    family=self.family.get(m),
                    auroc=self.auroc.get(m),
                    score=x,
                    rank=None if x is None else above + 1,
                    percentile=None if x is None or not scored else 100.0 * at_most / scored,
                    scored=scored,
                )
            )
        return sorted(out, key=lambda c: (-(c.auroc if c.auroc is not None else -1), c.method))

    def tally(self, column: str) -> dict[str, int]:
        """Questions per value of ``label``, ``label_status`` or ``label_grader`` (a missing
        value counts under ``"none"``)."""
        if column not in ("label", "label_status", "label_grader"):
            raise ValueError(f"cannot tally {column!r}")
        cur = self._con.cursor()
        try:
            rows = cur.execute(
                f"SELECT {column}, count(*) FROM b GROUP BY 1 ORDER BY 2 DESC, 1"
            ).fetchall()
        finally:
            cur.close()
        return {("none" if k is None else str(k)): int(v) for k, v in rows}

    def close(self) -> None:
        self._con.close()
        self._tmp.cleanup()


def _rank_pct(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rank, percentile) of each value among the finite ones (NaN: not scored): one sort, the
    ties found in sorted order (a ``searchsorted`` of the unsorted values was 5x slower)."""
    v = np.asarray(v, np.float64)
    where = np.flatnonzero(np.isfinite(v))
    order = np.argsort(v[where], kind="stable")
    s = v[where][order]
    m = len(s)
    last = np.flatnonzero(np.r_[s[1:] != s[:-1], True]) if m else np.empty(0, np.int64)
    at_most_sorted = np.repeat(last + 1, np.diff(np.r_[0, last + 1]))  # # values <= each
    at_most = np.empty(m, np.int64)
    at_most[order] = at_most_sorted
    rank = np.zeros(len(v), np.int32)
    pct = np.full(len(v), np.nan)
    rank[where] = m - at_most + 1
    pct[where] = 100.0 * at_most / max(m, 1)
    return rank, pct


def _disagree(pcts: list[np.ndarray], n: int) -> np.ndarray:
    if len(pcts) < 2:
        return np.zeros(n, bool)
    hi = np.fmax.reduce(pcts)  # NaN (not scored) ignored; all NaN stays NaN: no disagreement
    lo = np.fmin.reduce(pcts)
    return (hi >= DISAGREE_HIGH) & (lo <= DISAGREE_LOW)

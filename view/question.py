"""One question's page: its prompt row, its K + 1 generations token by token, the grader's
verdict, the samples' exact-match clusters and every detector's score with its percentile.

Rows are read by position: the index knows the question's row of ``prompts.parquet`` and the
row range of its generations, so only the row groups holding them are read (one of each for a
question whose generations are contiguous, as consolidation writes them)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hallulog.evaluation.semantic_entropy import cluster_exact, discrete_entropy, normalize_answer
from hallulog.view.index import QuestionIndex
from hallulog.view.models import (
    Alternative,
    ClusterView,
    GenerationView,
    QuestionDetail,
    TokenView,
)

__all__ = ["load_question", "read_rows", "token_colour"]

_PROMPT_COLUMNS = [
    "prompt_id",
    "dataset",
    "split",
    "dataset_id",
    "prompt",
    "messages",
    "question",
    "reference_answer",
    "reference_aliases",
    "label",
    "label_grader",
    "label_status",
    "judge_verdict",
    "meta_json",
]
_GENERATION_COLUMNS = [
    "prompt_id",
    "sample_id",
    "role",
    "text",
    "finish_reason",
    "temperature",
    "tokens",
    "token_logprobs",
    "top_logprob_tokens",
    "top_logprobs",
    "label",
    "label_status",
    "answer_span",
]
_LABEL_COLUMNS = ["prompt_id", "label_source", "verdict", "abstained", "judge_model"]


def read_rows(path: Path, first: int, last: int, columns: list[str]) -> list[dict[str, Any]]:
    """Rows ``first..last`` (inclusive) of a Parquet file, reading only their row groups."""
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    have = set(pf.schema_arrow.names)
    cols = [c for c in columns if c in have]
    out: list[dict[str, Any]] = []
    offset = 0
    for i in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(i).num_rows
        if offset + n > first and offset <= last:
            lo, hi = max(first - offset, 0), min(last - offset, n - 1)
            out += pf.read_row_group(i, columns=cols).slice(lo, hi - lo + 1).to_pylist()
        offset += n
        if offset > last:
            break
    return out


def token_colour(logprob: float | None) -> str:
    """Background of a token: hue 0 (red) at p = 0 to 120 (green) at p = 1, p = exp(logprob)."""
    if logprob is None or not math.isfinite(logprob):
        return "hsl(0, 0%, 88%)"
    return f"hsl({120.0 * math.exp(min(logprob, 0.0)):.0f}, 75%, 82%)"


def _tokens(g: dict[str, Any]) -> list[TokenView]:
    tokens = g.get("tokens") or []
    lps = g.get("token_logprobs") or []
    alt_t = g.get("top_logprob_tokens") or []
    alt_l = g.get("top_logprobs") or []
    span = g.get("answer_span")
    text = g.get("text") or ""
    offsets_ok = "".join(tokens).startswith(text) or text.startswith("".join(tokens))
    out, pos = [], 0
    for i, tok in enumerate(tokens):
        lp = lps[i] if i < len(lps) else None
        lp = None if lp is None or not math.isfinite(lp) else float(lp)
        alts = [
            Alternative(text=t, logprob=v, prob=None if v is None else math.exp(min(v, 0.0)))
            for t, v in zip(alt_t[i] if i < len(alt_t) else [], alt_l[i] if i < len(alt_l) else [])
        ]
        start, pos = pos, pos + len(tok or "")
        in_span = bool(span and offsets_ok and start < span[1] and pos > span[0])
        out.append(
            TokenView(
                text=tok or "",
                logprob=lp,
                prob=None if lp is None else math.exp(min(lp, 0.0)),
                colour=token_colour(lp),
                alternatives=alts,
                in_span=in_span,
            )
        )
    return out


def _generation(g: dict[str, Any], cluster: int | None) -> GenerationView:
    span = g.get("answer_span")
    text = g.get("text")
    lps = [v for v in (g.get("token_logprobs") or []) if v is not None and math.isfinite(v)]
    return GenerationView(
        sample_id=g["sample_id"],
        role=g.get("role"),
        text=text,
        finish_reason=g.get("finish_reason"),
        temperature=g.get("temperature"),
        label=g.get("label"),
        label_status=g.get("label_status"),
        answer_span=span,
        span_text=text[span[0] : span[1]] if span and text else None,
        tokens=_tokens(g),
        cluster=cluster,
        mean_logprob=sum(lps) / len(lps) if lps else None,
    )


def _clusters(gens: list[dict[str, Any]]) -> tuple[list[ClusterView], dict[int, int], float]:
    """The K samples' clusters by normalised exact match (as ``se_discrete_exact``), each
    generation's cluster (the primary: the cluster its answer falls in, if any) and the
    entropy of the cluster sizes."""
    samples = [g for g in gens if g["sample_id"] != 0]
    ids = cluster_exact([g.get("text") or "" for g in samples])
    views: dict[int, ClusterView] = {}
    for g, c in zip(samples, ids):
        v = views.get(c)
        members = (v.samples if v else []) + [g["sample_id"]]
        views[c] = ClusterView(
            id=c,
            size=len(members),
            share=len(members) / len(samples),
            samples=members,
            text=v.text if v else (g.get("text") or ""),
        )
    of = {g["sample_id"]: c for g, c in zip(samples, ids)}
    by_norm = {normalize_answer(v.text): v.id for v in views.values()}
    for g in gens:
        if g["sample_id"] == 0 and normalize_answer(g.get("text") or "") in by_norm:
            of[0] = by_norm[normalize_answer(g.get("text") or "")]
    entropy = discrete_entropy(ids) if ids else float("nan")
    ordered = sorted(views.values(), key=lambda v: (-v.size, v.id))
    return ordered, of, entropy


def _label_row(index: QuestionIndex, n: int, prompt_id: str) -> dict[str, Any]:
    path = index.files.labels
    if path is None:
        return {}
    rows = read_rows(path, n, n, _LABEL_COLUMNS)  # written in the prompts' order
    if rows and rows[0]["prompt_id"] == prompt_id:
        return rows[0]
    import pyarrow.parquet as pq

    t = pq.read_table(path, columns=_LABEL_COLUMNS, filters=[("prompt_id", "=", prompt_id)])
    return t.to_pylist()[0] if t.num_rows else {}


def load_question(index: QuestionIndex, prompt_id: str) -> QuestionDetail | None:
    """The page of ``prompt_id``; None when the run has no such question."""
    where = index.locate(prompt_id)
    if where is None:
        return None
    n = where["n"]
    p = read_rows(index.files.prompts, n, n, _PROMPT_COLUMNS)[0]
    gens: list[dict[str, Any]] = []
    if where["g0"] is not None:
        rows = read_rows(index.files.generations, where["g0"], where["g1"], _GENERATION_COLUMNS)
        gens = sorted(
            (g for g in rows if g["prompt_id"] == prompt_id), key=lambda g: g["sample_id"]
        )
    clusters, of, entropy = _clusters(gens)
    lab = _label_row(index, n, prompt_id)
    try:
        meta = json.loads(p.get("meta_json") or "{}")
    except json.JSONDecodeError:
        meta = {"meta_json": p.get("meta_json")}
    meta = meta if isinstance(meta, dict) else {"meta": meta}
    context = meta.get("context")
    return QuestionDetail(
        prompt_id=prompt_id,
        n=n,
        dataset=p.get("dataset"),
        split=p.get("split"),
        dataset_id=p.get("dataset_id"),
        question=p.get("question"),
        prompt=p.get("prompt"),
        messages=p.get("messages") or [],
        context=context if isinstance(context, str) else None,
        meta={k: v for k, v in meta.items() if k not in ("question", "context")},
        reference_answer=p.get("reference_answer"),
        reference_aliases=p.get("reference_aliases") or [],
        label=p.get("label"),
        label_status=p.get("label_status"),
        label_grader=p.get("label_grader"),
        label_source=lab.get("label_source"),
        verdict=lab.get("verdict"),
        judge_model=lab.get("judge_model"),
        judge_verdict=p.get("judge_verdict"),
        abstained=lab.get("abstained"),
        generations=[_generation(g, of.get(g["sample_id"])) for g in gens],
        clusters=clusters,
        cluster_entropy=entropy if math.isfinite(entropy) else None,
        detectors=index.detectors(where["scores"]),
        evaluation_missing=index.files.evaluation_missing,
    )

"""The run page: what the run is (manifest), what it holds (counts, label balance) and how the
detectors rank (``evaluation/report.json``: AUROC and PRR with their 95 % intervals, the
per-layer AUROC of every probe, evaluate's plots)."""

from __future__ import annotations

import math
from typing import Any

from hallulog.view.index import QuestionIndex
from hallulog.view.models import MethodRank, PerLayer, RunSummary

__all__ = ["run_summary", "ranking"]


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _pair(v: Any) -> tuple[float | None, float | None]:
    if isinstance(v, (list, tuple)) and len(v) == 2:
        return _num(v[0]), _num(v[1])
    return None, None


def ranking(report: dict[str, Any] | None) -> list[MethodRank]:
    """Every method of the report, by AUROC (best first; methods without one last)."""
    methods = (report or {}).get("methods") or {}

    def key(item: tuple[str, dict]) -> tuple:
        a = _num(item[1].get("auroc"))
        return (a is None, -(a or 0.0), item[0])

    out = []
    for i, (name, r) in enumerate(sorted(methods.items(), key=key), 1):
        lo, hi = _pair(r.get("ci95"))
        metrics = r.get("metrics") or {}
        prr_lo, prr_hi = _pair((r.get("metrics_ci95") or {}).get("prr"))
        layers = r.get("selected_layers")
        out.append(
            MethodRank(
                rank=i,
                method=name,
                family=r.get("family"),
                kind=r.get("kind"),
                auroc=_num(r.get("auroc")),
                auroc_lo=lo,
                auroc_hi=hi,
                prr=_num(metrics.get("prr")),
                prr_lo=prr_lo,
                prr_hi=prr_hi,
                n=r.get("n"),
                n_hallucinated=r.get("n_hallucinated"),
                selected_layers=[int(x) for x in layers if x is not None]
                if isinstance(layers, list)
                else None,
            )
        )
    return out


def _per_layer(report: dict[str, Any] | None) -> list[PerLayer]:
    out = []
    for name, r in sorted(((report or {}).get("per_layer") or {}).items()):
        if not isinstance(r, dict) or not r.get("layer_ids"):
            continue
        sel = r.get("selected_layers")
        out.append(
            PerLayer(
                method=name,
                layer_ids=[int(x) for x in r["layer_ids"]],
                auroc=[_num(a) for a in r.get("auroc") or []],
                selected_layers=sorted({int(x) for x in sel if x is not None})
                if isinstance(sel, list)
                else None,
            )
        )
    return out


def run_summary(index: QuestionIndex) -> RunSummary:
    import pyarrow.parquet as pq

    files = index.files
    manifest = dict(files.manifest.items()) if files.manifest is not None else {}
    labels = index.tally("label")
    counts = {
        "prompts": index.size,
        "generations": pq.ParquetFile(files.generations).metadata.num_rows,
        "labelled": index.size - labels.get("none", 0),
        "hallucinated": labels.get("1", 0),
        "correct": labels.get("0", 0),
        "unlabelled": labels.get("none", 0),
    }
    report = files.report or {}
    config = manifest.get("config")
    return RunSummary(
        root=str(files.root),
        run_id=manifest.get("run_id"),
        model=manifest.get("model"),
        dataset=manifest.get("dataset"),
        split=manifest.get("split"),
        k_samples=manifest.get("k_samples"),
        config=config if isinstance(config, dict) else {},
        counts=counts,
        label_status=index.tally("label_status"),
        graders=index.tally("label_grader"),
        protocol=report.get("protocol") or {},
        ranking=ranking(report),
        per_layer=_per_layer(report),
        plots=sorted(files.plots),
        skipped={str(k): str(v) for k, v in (report.get("skipped") or {}).items()},
        default_methods=index.default_methods,
        evaluation_missing=files.evaluation_missing,
    )

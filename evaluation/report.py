"""The evaluation report: ``report.json``, ``report.md`` and PNG plots in ``evaluation/``."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
from hallulog.contracts import layout
from hallulog.evaluation.report_plots import write_plots
from hallulog.evaluation.report_tables import (
    comparison_table,
    format_table,
    graders_section,
    leakage_section,
    risk_coverage_table,
)

__all__ = ["write_report", "format_table", "report_dir"]


def report_dir(artifact_root: Path | str) -> Path:
    """Where ``evaluate`` writes its report by default: the run's ``evaluation/``."""
    return layout.evaluation_dir(artifact_root)


def _markdown(report: dict, plots: list[str]) -> str:
    lab, proto = report["labels"], report["protocol"]
    run = report["run"]
    out = [
        "# Hallucination detectors: evaluation report",
        "",
        f"Run `{report['artifact_root']}`: model {run.get('model')}, {run.get('dataset')} "
        f"{run.get('split')}, K={run.get('k_samples')}, profile {run.get('logging_profile')}.",
        "",
        f"Labels: {lab['correct']} correct / {lab['hallucinated']} hallucinated "
        f"({lab['unlabeled']} unlabeled{_no_answer(lab)}, left out). Protocol: {proto['scheme']} split by prompt id "
        f"(seed {proto['seed']}), {proto['test_prompts']} test prompts, AUROC with "
        f"{proto['bootstrap']}-resample bootstrap 95 % intervals; scores oriented "
        f"{proto['score_orientation']}. Probes: out-of-fold scores, layer chosen per test fold "
        "on the other folds (docs/evaluation.md). Ranked by AUROC; PRR (higher is better) and "
        "FPR@95 (the false-positive rate at 95 % of hallucinations caught, lower is better) "
        "beside it with their ranks.",
        "",
        format_table(report),
        "",
    ]
    out += leakage_section(report)
    out += graders_section(report)
    out += comparison_table(report)
    out += risk_coverage_table(report)
    if report["skipped"]:
        out += (
            ["## Skipped", ""] + [f"- `{m}`: {why}" for m, why in report["skipped"].items()] + [""]
        )
    if report["per_layer"]:
        out += [
            "## AUROC per layer",
            "",
            "| layer | " + " | ".join(report["per_layer"]) + " |",
            "|---|" + "---|" * len(report["per_layer"]),
        ]
        first = next(iter(report["per_layer"].values()))
        for i, lid in enumerate(first["layer_ids"]):
            vals = []
            for p in report["per_layer"].values():
                v = p["auroc"][i]
                vals.append(f"{v:.3f}" if v is not None and math.isfinite(v) else "n/a")
            out.append(f"| {lid} | " + " | ".join(vals) + " |")
        out.append("")
    out += [f"![{p}]({p})" for p in plots]
    t = report["timings_s"]
    out += [
        "",
        f"Evaluated in {t.get('total_s', 0):.1f} s, peak RSS {report['peak_rss_mib']:.0f} MiB.",
    ]
    return "\n".join(out) + "\n"


def _clean(obj):
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.generic):
        return _clean(obj.item())
    return obj


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_report(report: dict, out: Path, *, plots: bool = True) -> Path:
    """Write report.json, report.md and the plots into ``out``; returns report.md's path."""
    out.mkdir(parents=True, exist_ok=True)
    made = write_plots(report, out) if plots else []
    public = {k: v for k, v in report.items() if not k.startswith("_")}
    public["plots"] = made
    _atomic_write(out / layout.REPORT_JSON, json.dumps(_clean(public), indent=2) + "\n")
    _atomic_write(out / layout.REPORT_MD, _markdown(public, made))
    return out / layout.REPORT_MD


def _no_answer(labels: dict) -> str:
    """`` of which N no_answer`` when some primaries' reasoning never closed."""
    return f", of which {labels['no_answer']} no_answer" if labels.get("no_answer") else ""

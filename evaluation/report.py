"""The evaluation report: ``report.json``, ``report.md`` and PNG plots in ``evaluation/``."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
from hallulog.contracts import layout

__all__ = ["write_report", "format_table", "report_dir"]


def report_dir(artifact_root: Path | str) -> Path:
    """Where ``evaluate`` writes its report by default: the run's ``evaluation/``."""
    return layout.evaluation_dir(artifact_root)


def _fmt(r: dict) -> str:
    a, (lo, hi) = r["auroc"], r["ci95"]
    if not math.isfinite(a):
        return "n/a"
    return f"{a:.3f} [{lo:.3f}, {hi:.3f}]"


def _ranked(report: dict) -> list[tuple[str, dict]]:
    items = list(report["methods"].items())
    return sorted(items, key=lambda kv: -kv[1]["auroc"] if math.isfinite(kv[1]["auroc"]) else 9)


def _metric(r: dict, key: str, ci: bool = False) -> str:
    v = (r.get("metrics") or {}).get(key)
    if v is None or not math.isfinite(v):
        return ""
    if not ci:
        return f"{v:.3f}"
    lo, hi = (r.get("metrics_ci95") or {}).get(key, [float("nan")] * 2)
    return f"{v:.3f} [{lo:.3f}, {hi:.3f}]"


def format_table(report: dict) -> str:
    lines = [
        "| method | family | AUROC [95% CI] | PRR [95% CI] | PR-AUC hall. | PR-AUC corr. "
        "| RCC-AUC | ECE | Brier | n | layer(s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in _ranked(report):
        layers = ""
        if r.get("selected_layers"):
            uniq = sorted({x for x in r["selected_layers"] if x is not None})
            layers = ",".join(map(str, uniq))
        elif r.get("layer") is not None:
            layers = str(r["layer"])
        lines.append(
            f"| {name} | {r['family']} | {_fmt(r)} | {_metric(r, 'prr', True)} | "
            f"{_metric(r, 'pr_auc_hallucinated')} | {_metric(r, 'pr_auc_correct')} | "
            f"{_metric(r, 'rcc_auc')} | {_metric(r, 'ece')} | {_metric(r, 'brier')} | "
            f"{r['n']} | {layers} |"
        )
    return "\n".join(lines)


def _comparison(report: dict) -> list[str]:
    comp = report.get("comparison") or {}
    if not comp.get("against"):
        return []
    out = [
        f"## Paired bootstrap: `{comp['best']}` against each method",
        "",
        "| method | ΔAUROC [95% CI] | P(Δ ≤ 0) | ΔPRR [95% CI] |",
        "|---|---|---|---|",
    ]
    for m, d in comp["against"].items():
        a, p = d.get("auroc"), d.get("prr")
        if not a:
            continue
        out.append(
            f"| {m} | {a['diff']:+.3f} [{a['ci95'][0]:+.3f}, {a['ci95'][1]:+.3f}] | "
            f"{a['p_le_0']:.3f} | {p['diff']:+.3f} [{p['ci95'][0]:+.3f}, "
            f"{p['ci95'][1]:+.3f}] |"
        )
    return out + [""]


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
        f"({lab['unlabeled']} unlabeled, left out). Protocol: {proto['scheme']} split by prompt id "
        f"(seed {proto['seed']}), {proto['test_prompts']} test prompts, AUROC with "
        f"{proto['bootstrap']}-resample bootstrap 95 % intervals; scores oriented "
        f"{proto['score_orientation']}. Probes: out-of-fold scores, layer chosen per test fold "
        "on the other folds (docs/evaluation.md).",
        "",
        format_table(report),
        "",
    ]
    out += _comparison(report)
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


def _plots(report: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import roc_curve

    made = []
    if report["per_layer"]:
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, p in report["per_layer"].items():
            ax.plot(
                p["layer_ids"],
                [np.nan if v is None else v for v in p["auroc"]],
                marker=".",
                label=name,
            )
        ax.axhline(0.5, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("layer id (0 = embeddings)")
        ax.set_ylabel("AUROC (out of fold)")
        ax.set_title("Probe AUROC per layer")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "auroc_per_layer.png", dpi=110)
        plt.close(fig)
        made.append("auroc_per_layer.png")
    curves = report.get("_curves")
    if curves:
        best: dict[str, str] = {}
        for name, r in _ranked(report):
            if math.isfinite(r["auroc"]):
                best.setdefault(r["family"], name)
        fig, ax = plt.subplots(figsize=(5.5, 5))
        y = curves["labels"]
        for name in best.values():
            s = curves["scores"][name]
            ok = np.isfinite(s)
            fpr, tpr, _ = roc_curve(y[ok], s[ok])
            ax.plot(fpr, tpr, label=f"{name} ({report['methods'][name]['auroc']:.3f})")
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--")
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate (hallucination detected)")
        ax.set_title("ROC, best method of each family")
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        fig.savefig(out / "roc_best_per_family.png", dpi=110)
        plt.close(fig)
        made.append("roc_best_per_family.png")
    return made


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
    made = _plots(report, out) if plots else []
    public = {k: v for k, v in report.items() if not k.startswith("_")}
    public["plots"] = made
    _atomic_write(out / layout.REPORT_JSON, json.dumps(_clean(public), indent=2) + "\n")
    _atomic_write(out / layout.REPORT_MD, _markdown(public, made))
    return out / layout.REPORT_MD

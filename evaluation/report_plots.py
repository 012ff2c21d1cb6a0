"""The report's PNG plots: AUROC per layer of every probe, the ROC curve of the best method of
each family, and the risk-coverage curve of every method (one panel per method)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from hallulog.evaluation.metrics import risk_curve
from hallulog.evaluation.report_tables import ranked

__all__ = ["write_plots", "RISK_COVERAGE_PNG"]

RISK_COVERAGE_PNG = "risk_coverage.png"


def _per_layer(report: dict, out: Path, plt) -> str | None:
    if not report["per_layer"]:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, p in report["per_layer"].items():
        ax.plot(
            p["layer_ids"], [np.nan if v is None else v for v in p["auroc"]], marker=".", label=name
        )
    ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("layer id (0 = embeddings)")
    ax.set_ylabel("AUROC (out of fold)")
    ax.set_title("Probe AUROC per layer")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "auroc_per_layer.png", dpi=110)
    plt.close(fig)
    return "auroc_per_layer.png"


def _roc(report: dict, curves: dict, out: Path, plt) -> str:
    from sklearn.metrics import roc_curve

    best: dict[str, str] = {}
    for name, r in ranked(report):
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
    ax.legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "roc_best_per_family.png", dpi=110)
    plt.close(fig)
    return "roc_best_per_family.png"


def _risk_coverage(report: dict, curves: dict, out: Path, plt) -> str | None:
    names = [m for m, r in ranked(report) if math.isfinite(r["auroc"])]
    if not names:
        return None
    cols = min(6, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(2.3 * cols, 1.9 * rows), sharex=True, sharey=True, squeeze=False
    )
    y = curves["labels"]
    for ax, name in zip(axes.flat, names):
        s = curves["scores"][name]
        ok = np.isfinite(s)
        cov, risk = risk_curve(y[ok], s[ok])
        step = max(1, len(cov) // 200)
        ax.plot(cov[::step], risk[::step], lw=1.2)
        ocov, orisk = risk_curve(y[ok], y[ok])  # the oracle: hallucinations last
        ax.plot(ocov[::step], orisk[::step], color="grey", lw=0.7, ls=":")
        ax.axhline(float(y[ok].mean()) if ok.any() else np.nan, color="grey", lw=0.7, ls="--")
        ax.set_title(name, fontsize=6)
        ax.tick_params(labelsize=5)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    fig.supxlabel("coverage (share answered, least uncertain first)", fontsize=8)
    fig.supylabel("risk (hallucination rate)", fontsize=8)
    fig.suptitle("Risk–coverage per method (dotted: oracle, dashed: random)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / RISK_COVERAGE_PNG, dpi=100)
    plt.close(fig)
    return RISK_COVERAGE_PNG


def write_plots(report: dict, out: Path) -> list[str]:
    """Write the plots into ``out``; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = [_per_layer(report, out, plt)]
    curves = report.get("_curves")
    if curves:
        made += [_roc(report, curves, out, plt), _risk_coverage(report, curves, out, plt)]
    return [m for m in made if m]

"""The Markdown tables of ``report.md``: the ranking, the paired comparison, the guards (leakage,
graders) and the risk-coverage table."""

from __future__ import annotations

import math

__all__ = [
    "format_table",
    "ranked",
    "comparison_table",
    "leakage_section",
    "graders_section",
    "risk_coverage_table",
]


def _num(v, digits: int = 3) -> str:
    return f"{v:.{digits}f}" if v is not None and math.isfinite(v) else ""


def _fmt(r: dict) -> str:
    a, (lo, hi) = r["auroc"], r["ci95"]
    if a is None or not math.isfinite(a):
        return "n/a"
    return f"{a:.3f} [{lo:.3f}, {hi:.3f}]"


def ranked(report: dict) -> list[tuple[str, dict]]:
    """The methods by AUROC, best first (``report["ranking"]["auroc"]`` when present)."""
    order = (report.get("ranking") or {}).get("auroc")
    if order:
        return [(m, report["methods"][m]) for m in order if m in report["methods"]]
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


def _ranks(report: dict) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for key, order in (report.get("ranking") or {}).items():
        for i, m in enumerate(order, 1):
            out.setdefault(m, {})[key] = i
    return out


def format_table(report: dict) -> str:
    """Every method ranked by AUROC, with PRR and FPR@95 (and their ranks) beside it."""
    ranks = _ranks(report)
    lines = [
        "| method | family | AUROC [95% CI] | PRR [95% CI] | FPR@95 [95% CI] "
        "| rank AUROC / PRR / FPR@95 | AUROC unleaked | PR-AUC hall. | PR-AUC corr. "
        "| RCC-AUC | ECE | Brier | n | layer(s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in ranked(report):
        layers = ""
        if r.get("selected_layers"):
            uniq = sorted({x for x in r["selected_layers"] if x is not None})
            layers = ",".join(map(str, uniq))
        elif r.get("layer") is not None:
            layers = str(r["layer"])
        rk = ranks.get(name, {})
        rank = " / ".join(str(rk.get(k, "")) for k in ("auroc", "prr", "fpr_at_95_tpr"))
        unleaked = _num((r.get("unleaked") or {}).get("auroc"))
        lines.append(
            f"| {name} | {r['family']} | {_fmt(r)} | {_metric(r, 'prr', True)} | "
            f"{_metric(r, 'fpr_at_95_tpr', True)} | {rank} | {unleaked} | "
            f"{_metric(r, 'pr_auc_hallucinated')} | {_metric(r, 'pr_auc_correct')} | "
            f"{_metric(r, 'rcc_auc')} | {_metric(r, 'ece')} | {_metric(r, 'brier')} | "
            f"{r['n']} | {layers} |"
        )
    return "\n".join(lines)


def comparison_table(report: dict) -> list[str]:
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


def leakage_section(report: dict) -> list[str]:
    lk = report.get("leakage")
    if not lk:
        return []
    out = [
        "## Leakage: the reference answer in what the model was given",
        "",
        f"{lk['leaked']} of {lk['checked']} checked prompts leaked "
        f"({lk.get('leaked_correct', 0)} correct, {lk.get('leaked_hallucinated', 0)} "
        f"hallucinated); by source: "
        + (", ".join(f"{k} {v}" for k, v in sorted(lk.get("by_source", {}).items())) or "none")
        + ". Rule: docs/evaluation.md, Guards.",
        "",
    ]
    if not lk["leaked"]:
        return out + ["No prompt leaked: the unleaked figures equal the all-prompt ones.", ""]
    out += [
        "| method | AUROC all | AUROC unleaked | PRR all | PRR unleaked | FPR@95 all "
        "| FPR@95 unleaked | n all | n unleaked |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in ranked(report):
        u = r.get("unleaked") or {}
        um = u.get("metrics") or {}
        m = r.get("metrics") or {}
        out.append(
            f"| {name} | {_num(r['auroc'])} | {_num(u.get('auroc'))} | {_num(m.get('prr'))} | "
            f"{_num(um.get('prr'))} | {_num(m.get('fpr_at_95_tpr'))} | "
            f"{_num(um.get('fpr_at_95_tpr'))} | {r['n']} | {u.get('n', '')} |"
        )
    return out + [""]


def graders_section(report: dict) -> list[str]:
    g = report.get("graders") or {}
    others = g.get("others") or {}
    if not others:
        return [
            "## Graders",
            "",
            f"One grader labels the primary answers (`{g.get('primary')}`): no agreement to "
            "report.",
            "",
        ]
    out = ["## Graders", ""]
    for name, entry in others.items():
        a = entry["agreement"]
        out += [
            f"`{g.get('primary')}` (the labels above) against `{name}`: Cohen's kappa "
            f"{_num(a.get('kappa'))}, agreement {_num(a.get('agreement'))} on {a.get('n', 0)} "
            f"prompts both label ({a.get('confusion', {})}).",
            "",
            f"| method | AUROC ({name}) | PRR ({name}) | FPR@95 ({name}) | n |",
            "|---|---|---|---|---|",
        ]
        for m, r in entry["methods"].items():
            out.append(
                f"| {m} | {_num(r['auroc'])} | {_num(r['prr'])} | "
                f"{_num(r['fpr_at_95_tpr'])} | {r['n']} |"
            )
        out.append("")
    return out


def risk_coverage_table(report: dict) -> list[str]:
    rows = [(m, r["risk_coverage"]) for m, r in ranked(report) if r.get("risk_coverage")]
    if not rows:
        return []
    cov = rows[0][1]["coverage"]
    out = [
        "## Risk–coverage",
        "",
        "Hallucination rate of the answers kept when only the least uncertain share (coverage) "
        "is answered; `risk_coverage.png` draws every method's curve.",
        "",
        "| method | " + " | ".join(f"{c:.0%}" for c in cov) + " |",
        "|---|" + "---|" * len(cov),
    ]
    for m, rc in rows:
        out.append(f"| {m} | " + " | ".join(_num(v) for v in rc["risk"]) + " |")
    return out + [""]

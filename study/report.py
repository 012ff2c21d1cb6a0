"""``compare/report.md``: the cells, the detector x cell tables, the paired differences and the
transfer matrices, as Markdown."""

from __future__ import annotations

import json
import math

from hallulog.study.plots import method_order

__all__ = ["compare_markdown", "MAX_PAIRED_ROWS"]

MAX_PAIRED_ROWS = 40
"""Paired rows listed in the report (largest |ΔAUROC| first); paired.parquet holds them all."""


def _ci(v: float, lo: float, hi: float) -> str:
    if not math.isfinite(v):
        return "n/a"
    return f"{v:.3f} [{lo:.3f}, {hi:.3f}]"


def _pivot(rows: list[dict], cells: list[str], metric: str) -> list[str]:
    by = {(r["method"], r["cell"]): r for r in rows}
    out = ["| method | " + " | ".join(cells) + " |", "|---|" + "---|" * len(cells)]
    for m in method_order(rows):
        vals = []
        for c in cells:
            r = by.get((m, c))
            vals.append("" if r is None else _ci(r[metric], r[f"{metric}_lo"], r[f"{metric}_hi"]))
        out.append(f"| `{m}` | " + " | ".join(vals) + " |")
    return out


def _values(values: dict) -> str:
    text = ", ".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in values.items())
    return text.replace("|", "\\|")  # a table cell


def _paired(rows: list[dict]) -> list[str]:
    if not rows:
        return ["No two cells share test prompts: nothing to pair.", ""]
    clear = [
        r
        for r in rows
        if math.isfinite(r["auroc_diff_lo"]) and (r["auroc_diff_lo"] > 0 or r["auroc_diff_hi"] < 0)
    ]
    clear.sort(key=lambda r: -abs(r["auroc_diff"]))
    out = [
        f"{len(rows)} comparisons (paired.parquet); {len(clear)} whose ΔAUROC interval excludes "
        f"0{f', the {MAX_PAIRED_ROWS} largest' if len(clear) > MAX_PAIRED_ROWS else ''}:",
        "",
        "| method | cell a | cell b | n | AUROC a / b | ΔAUROC [95% CI] | ΔPRR [95% CI] |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in clear[:MAX_PAIRED_ROWS]:
        out.append(
            f"| `{r['method']}` | {r['cell_a']} | {r['cell_b']} | {r['n']} | "
            f"{r['auroc_a']:.3f} / {r['auroc_b']:.3f} | "
            f"{r['auroc_diff']:+.3f} [{r['auroc_diff_lo']:+.3f}, {r['auroc_diff_hi']:+.3f}] | "
            f"{r['prr_diff']:+.3f} [{r['prr_diff_lo']:+.3f}, {r['prr_diff_hi']:+.3f}] |"
        )
    return out + [""]


def _transfer(rows: list[dict], cells: list[str], stats) -> list[str]:
    if stats is None:
        return ["Not computed (`--no-transfer`).", ""]
    out = []
    for probe in sorted({r["method"] for r in rows}):
        by = {(r["train_cell"], r["test_cell"]): r["auroc"] for r in rows if r["method"] == probe}
        used = [c for c in cells if any(c in k for k in by)]
        out += [
            f"### `{probe}` (rows: trained on, columns: tested on)",
            "",
            "| train \\ test | " + " | ".join(used) + " |",
            "|---|" + "---|" * len(used),
        ]
        for a in used:
            vals = [
                f"{by[(a, b)]:.3f}" if (a, b) in by and math.isfinite(by[(a, b)]) else ""
                for b in used
            ]
            out.append(f"| {a} | " + " | ".join(vals) + " |")
        out.append("")
    per_pair = stats.seconds / stats.pairs if stats.pairs else 0.0
    out.append(
        f"Groups of cells of one model and layer shape: "
        f"{'; '.join(', '.join(g) for g in stats.groups) or 'none'}. "
        f"{stats.pairs} ordered pairs in {stats.seconds:.1f} s ({per_pair:.2f} s a pair)."
    )
    out += [f"- {name}: {why}" for name, why in stats.skipped.items()]
    return out + [""]


def compare_markdown(result) -> str:
    """The report of a ``compare`` result (``hallulog.study.compare.CompareResult``)."""
    cells = [c["name"] for c in result.cells if c["name"] not in result.skipped]
    out = [
        "# Detectors across cells",
        "",
        f"{len(result.cells)} cells, {len(cells)} compared. Figures from each cell's "
        "`evaluation/scores.parquet` by `evaluate`'s metric code (docs/studies.md).",
        "",
        "| cell | values | model | dataset | state | test prompts |",
        "|---|---|---|---|---|---|",
    ]
    for c in result.cells:
        state = c["state"] + (
            f": skipped, {result.skipped[c['name']]}" if c["name"] in result.skipped else ""
        )
        out.append(
            f"| {c['name']} | {_values(c['values'])} | {c.get('model') or ''} | "
            f"{c.get('dataset') or ''} | {state} | {c.get('test_prompts', '')} |"
        )
    out += [""] + [f"- {w}" for w in result.warnings] + ([""] if result.warnings else [])
    out += ["## AUROC [95% CI]", ""] + _pivot(result.table, cells, "auroc") + [""]
    out += ["## PRR [95% CI]", ""] + _pivot(result.table, cells, "prr") + [""]
    out += ["## FPR at 95 % TPR [95% CI] (lower is better)", ""]
    out += _pivot(result.table, cells, "fpr_at_95") + [""]
    out += ["## Paired bootstrap between cells sharing prompts", ""] + _paired(result.paired)
    out += ["## Transfer", ""] + _transfer(result.transfer, cells, result.transfer_stats)
    out += [f"![{p}]({p})" for p in result.plots]
    out += [
        "",
        f"Compared in {result.seconds:.1f} s, peak RSS {result.peak_rss_mib:.0f} MiB.",
        "",
    ]
    return "\n".join(out)

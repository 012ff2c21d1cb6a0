"""``python -m orchestrator evaluate``: the subcommand's arguments and entry points."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from hallulog.contracts import layout
from hallulog.contracts.errors import HallulogError
from hallulog.evaluation.report import format_table, report_dir, write_report

__all__ = ["add_evaluate_parser", "run_evaluate", "run_deep_audit", "report_path", "write_outputs"]

log = logging.getLogger(__name__)


def add_evaluate_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``evaluate`` to the CLI's subparsers."""
    from hallulog.evaluation.evaluate import ALL_METHODS, FAMILIES

    p = subparsers.add_parser(
        "evaluate",
        help="Score every hallucination detector from a run's consolidated/ files.",
        description="Scores every detector one pass allows (logprob and sample-consistency "
        "methods, Semantic Entropy and Energy, hidden-state probes, the ICR, layer-transition "
        "and question-token probes, a text-similarity baseline) from consolidated/ and the "
        "activation store (never the server), with the leakage and grader guards; writes "
        "evaluation/report.json, report.md, scores.parquet and plots. Definitions: "
        "docs/evaluation.md.",
    )
    p.add_argument(
        "--artifact-root",
        "--test-root",
        dest="artifact_root",
        type=Path,
        required=True,
        help="The run's artifact root (the run scored).",
    )
    p.add_argument(
        "--train-root",
        type=Path,
        help="Transfer: fit the probes on this run and score them on --test-root "
        "(same model and stored layers; docs/evaluation.md, Transfer).",
    )
    p.add_argument("--out", type=Path, help="Output directory (default: ARTIFACT_ROOT/evaluation).")
    p.add_argument(
        "--methods",
        nargs="+",
        metavar="METHOD",
        help=f"Families {', '.join(FAMILIES)} or single methods "
        f"({', '.join(sorted(ALL_METHODS))}); default: all available.",
    )
    p.add_argument("--seed", type=int, default=0, help="Split and bootstrap seed (default: 0).")
    p.add_argument("--folds", type=int, default=5, help="k of the k-fold probes (default: 5).")
    p.add_argument(
        "--bootstrap",
        type=int,
        default=1000,
        help="Bootstrap resamples of the AUROC intervals (default: 1000).",
    )
    p.add_argument(
        "--no-embeddings",
        action="store_true",
        help="Skip the sentence-embedding methods (no embedding model needed).",
    )
    p.add_argument("--no-plots", action="store_true", help="Write no PNG plots.")
    p.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="Logging level.",
    )
    return p


def report_path(artifact_root: Path | str) -> Path | None:
    """``evaluation/report.md`` of a run when it exists (for the status page and summary)."""
    path = report_dir(artifact_root) / layout.REPORT_MD
    return path if path.is_file() else None


def run_evaluate(args: argparse.Namespace) -> int:
    """The ``evaluate`` subcommand; 0 on success, 1 with a one-line message on bad input."""
    from hallulog.evaluation.evaluate import evaluate

    logging.basicConfig(
        level=getattr(args, "log_level", "WARNING"),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        report = evaluate(
            args.artifact_root,
            methods=args.methods,
            seed=args.seed,
            folds=args.folds,
            n_boot=args.bootstrap,
            embeddings=not args.no_embeddings,
            train_root=getattr(args, "train_root", None),
        )
    except HallulogError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    out = args.out or report_dir(args.artifact_root)
    md = write_outputs(report, out, plots=not args.no_plots)
    print(format_table(report))
    for m, why in report["skipped"].items():
        print(f"skipped {m}: {why}")
    print(
        f"report: {md} ({report['timings_s']['total_s']:.1f} s, peak RSS "
        f"{report['peak_rss_mib']:.0f} MiB)"
    )
    return 0


def write_outputs(report: dict, out: Path, *, plots: bool = True) -> Path:
    """Write an ``evaluate`` report and its per-prompt scores into ``out``; report.md's path."""
    from hallulog.evaluation.scores import SCORES_FILE, write_scores

    md = write_report(report, out, plots=plots)
    write_scores(report["_scores"], out / SCORES_FILE)
    return md


def run_deep_audit(artifact_root: Path | str, **options) -> dict:
    """The alignment audit of ``--validate-only --deep`` (see audit.py); prints a summary."""
    from hallulog.evaluation.audit import audit_alignment, format_audit

    result = audit_alignment(artifact_root, **options)
    print(format_audit(result))
    out = layout.consolidated_dir(artifact_root) / layout.ALIGNMENT_AUDIT
    if out.parent.is_dir():
        out.write_text(json.dumps(result, indent=2) + "\n")
    return result

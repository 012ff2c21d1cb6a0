"""``hallulog compare``: the subcommand's arguments and entry point (docs/studies.md)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from hallulog.contracts import layout
from hallulog.contracts.errors import HallulogError

__all__ = ["add_compare_parser", "run_compare"]

PROG = "hallulog compare"


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return v


def _folds(text: str) -> int:
    v = _positive(text)
    if v < 2:
        raise argparse.ArgumentTypeError(f"{text!r}: k-fold needs at least 2 folds")
    return v


def add_compare_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``compare`` to the CLI's subparsers."""
    p = subparsers.add_parser(
        "compare",
        help="Compare detectors across a study's cells (or run roots): table, paired "
        "bootstrap, transfer matrices.",
        description="Reads each cell's evaluation/scores.parquet (never runs a detector again) "
        "and writes table.parquet (detector x cell: AUROC, PRR, PR-AUC with bootstrap "
        "intervals), paired.parquet (cells sharing prompts), transfer.parquet (probes trained "
        "on one cell, tested on another of the same model), report.md and heatmaps into "
        "STUDY/compare/ or --out. docs/studies.md.",
    )
    p.add_argument(
        "roots",
        nargs="+",
        type=Path,
        metavar="STUDY_OR_RUN_ROOT",
        help="A study root (holding study.json), or with --out any number of run roots.",
    )
    p.add_argument("--out", type=Path, help="Output directory (default: STUDY/compare).")
    p.add_argument(
        "--methods",
        nargs="+",
        metavar="METHOD",
        help="Families or methods of `evaluate` to compare (default: every method scored).",
    )
    p.add_argument(
        "--seed",
        type=_positive,
        help="Bootstrap seed (default: the table uses each cell's own, paired and transfer 0).",
    )
    p.add_argument(
        "--bootstrap",
        type=_positive,
        help="Bootstrap resamples (default: the table each cell's own, paired and transfer 1000).",
    )
    p.add_argument(
        "--folds",
        type=_folds,
        default=5,
        help="k of the k-fold that chooses a transferred probe's layer (default: 5).",
    )
    p.add_argument(
        "--transfer-methods",
        nargs="+",
        metavar="PROBE",
        help="Probes (or probe families) of the transfer matrices (default: every probe compared).",
    )
    p.add_argument("--no-transfer", action="store_true", help="Compute no transfer matrices.")
    p.add_argument(
        "--evaluate",
        action="store_true",
        help="Evaluate finished cells that lack evaluation/ first (`hallulog evaluate`).",
    )
    p.add_argument(
        "--no-embeddings",
        action="store_true",
        help="With --evaluate: skip the sentence-embedding methods.",
    )
    p.add_argument("--no-plots", action="store_true", help="Write no heatmaps.")
    p.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="Logging level.",
    )
    p.add_argument("--debug", action="store_true", help="Print the traceback of an error.")
    return p


def _cells(args: argparse.Namespace):
    """(cells, output directory) of the arguments; a StudyError names what is wrong."""
    from hallulog.study.cells import root_cells, study_cells
    from hallulog.study.manifest import manifest_path
    from hallulog.study.naming import StudyError

    roots = args.roots
    if len(roots) == 1 and manifest_path(roots[0]).is_file():
        _, cells = study_cells(roots[0])
        return cells, args.out or layout.compare_dir(roots[0])
    if args.out is None:
        if len(roots) == 1 and roots[0].is_dir():
            raise StudyError(
                f"{roots[0]} holds no {layout.STUDY_MANIFEST}: to compare run roots give --out DIR"
            )
        raise StudyError("run roots need --out DIR (where the comparison is written)")
    return root_cells(roots), args.out


def run_compare(args: argparse.Namespace) -> int:
    """The ``compare`` subcommand: 0 done, 1 bad input or nothing to compare (one line)."""
    import pyarrow as pa
    from hallulog.study.compare import compare

    # compare reads two small Parquet columns per cell and method: Arrow's default allocator
    # (mimalloc) keeps the freed buffers in the process, the system's returns them (20 cells of
    # 10^4 prompts: 20 MiB less at the peak, docs/studies.md "Costs")
    pa.set_memory_pool(pa.system_memory_pool())
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    try:
        cells, out = _cells(args)
        result = compare(
            cells,
            out,
            methods=args.methods,
            seed=args.seed,
            n_boot=args.bootstrap,
            folds=args.folds,
            transfer=not args.no_transfer,
            transfer_methods=args.transfer_methods,
            evaluate_missing=args.evaluate,
            embeddings=not args.no_embeddings,
            plots=not args.no_plots,
        )
    except HallulogError as exc:
        if args.debug:
            raise
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    for name, why in result.skipped.items():
        print(f"skipped {name}: {why}", file=sys.stderr)
    compared = len(result.cells) - len(result.skipped)
    print(
        f"{compared} of {len(result.cells)} cells compared: {len(result.table)} table rows, "
        f"{len(result.paired)} paired, {len(result.transfer)} transfer; "
        f"report: {result.out / layout.REPORT_MD} ({result.seconds:.1f} s, peak RSS "
        f"{result.peak_rss_mib:.0f} MiB)"
    )
    return 0 if compared else 1

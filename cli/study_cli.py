"""``hallulog study run|status``: the subcommand's arguments and entry points (docs/studies.md)."""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
import time
from pathlib import Path

from hallulog.contracts.errors import HallulogError

__all__ = ["add_study_parser", "run_study_command"]

PROG = "hallulog study"


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return v


def add_study_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``study`` (with ``run`` and ``status``) to the CLI's subparsers."""
    from hallulog.cli.study_run import EXECUTORS

    p = subparsers.add_parser(
        "study",
        help="Run a study (the cells of a study file's axes, each an ordinary run) and show "
        "its cells' state.",
        description="A study file is a `run --config` file plus an [axes] table (models, "
        "tasks, prompts, seeds); its cells are the product of the axes, each a run root under "
        "STUDY/cells/<name>/, listed in STUDY/study.json. docs/studies.md.",
    )
    sub = p.add_subparsers(dest="study_command", required=True, metavar="{run,status}")
    r = sub.add_parser(
        "run",
        help="Plan every cell, then run the cells not done (a re-run resumes).",
        description="Builds and plans every cell's run first (a bad axis value is one line "
        "naming its cell), writes STUDY/study.json and STUDY/configs/<cell>.toml, then runs "
        "the cells not done, each as `hallulog run --config` of its file: one after another "
        "on this machine (local), each with the whole Ray cluster (ray), or as a Slurm array "
        "(slurm, deploy/slurm/study.sbatch). Re-running it skips done cells and resumes the "
        "others.",
    )
    r.add_argument("file", type=Path, metavar="STUDY_FILE", help="The study file (TOML or YAML).")
    r.add_argument("--root", type=Path, required=True, help="The study root (created).")
    r.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="local",
        help="local: cells one after another here; ray: the same, each cell's run on the Ray "
        "cluster (--ray-address); slurm: one array task per cell not done (default: local).",
    )
    r.add_argument("--ray-address", help="With --executor ray: the cluster (default: auto).")
    r.add_argument(
        "--sbatch",
        type=Path,
        help="With --executor slurm: the array script (default: deploy/slurm/study.sbatch).",
    )
    r.add_argument(
        "--sbatch-args",
        default="",
        help='With --executor slurm: more sbatch flags, one string ("--partition=gpu '
        '--gres=gpu:1 --time=12:00:00").',
    )
    r.add_argument(
        "--dry-run",
        action="store_true",
        help="Plan the cells and print each one's estimate (bytes, time) and the total against "
        "the free space; run nothing, write nothing.",
    )
    r.add_argument(
        "--rate",
        type=_positive_float,
        help="With --dry-run: generations per second the time estimate assumes.",
    )
    s = sub.add_parser("status", help="Each cell's state (pending, running, done, failed).")
    s.add_argument("root", type=Path, metavar="STUDY", help="The study root.")
    s.add_argument("--json", action="store_true", help="One JSON list, an entry per cell.")
    for q in (r, s):
        q.add_argument(
            "--log-level",
            default="WARNING",
            choices=["DEBUG", "INFO", "WARNING", "ERROR"],
            help="Logging level.",
        )
        q.add_argument("--debug", action="store_true", help="Print the traceback of an error.")
    return p


def _fail(exc: BaseException, debug: bool) -> int:
    if debug:
        raise exc
    if isinstance(exc, OSError) and exc.filename is not None:
        text = f"{exc.filename}: {exc.strerror or type(exc).__name__}"
    else:
        text = " ".join(str(exc).split()) or type(exc).__name__
    print(f"{PROG}: error: {text}", file=sys.stderr)
    return 1


def _status(args: argparse.Namespace) -> int:
    from hallulog.cli.study_status import format_status, study_status

    try:
        entries = study_status(args.root)
    except (HallulogError, OSError) as exc:
        return _fail(exc, args.debug)
    print(format_status(entries, as_json=args.json))
    return 0


def _run(args: argparse.Namespace) -> int:
    from hallulog.cli.study_plan import plan_study, write_cells
    from hallulog.cli.study_run import run_cells, submit_slurm

    overrides: dict = {}
    if args.executor == "ray":
        overrides["executor"] = "ray"
        if args.ray_address:
            overrides["ray_address"] = args.ray_address
    try:
        study = plan_study(args.file, args.root, overrides=overrides)
        if args.dry_run:
            from hallulog.cli.study_status import dry_run

            print(dry_run(study, rate=args.rate))
            return 0
        manifest = write_cells(study)
        print(f"{len(study.cells)} cells planned: {manifest}", flush=True)
        if args.executor == "slurm":
            job = submit_slurm(study, sbatch=args.sbatch, sbatch_args=shlex.split(args.sbatch_args))
            print("every cell is done" if job is None else f"submitted array job {job}")
            return 0
        started = time.monotonic()
        outcomes = run_cells(study)
    except (HallulogError, OSError) as exc:
        return _fail(exc, args.debug)
    except KeyboardInterrupt:  # between cells: nothing runs
        print("interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.state] = counts.get(o.state, 0) + 1
    print(
        f"study {args.root}: "
        + ", ".join(f"{n} {s}" for s, n in counts.items())
        + f" of {len(study.cells)} cells ({time.monotonic() - started:.0f} s); "
        f"`{PROG} status {args.root}` shows them"
    )
    if any(o.state == "interrupted" for o in outcomes):
        return 130
    return 0 if all(o.state in ("done", "skipped") for o in outcomes) else 1


def run_study_command(args: argparse.Namespace) -> int:
    """``study run`` / ``study status``: 0 done, 1 an error or a failed cell (one line), 130
    interrupted."""
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    if args.study_command == "status":
        return _status(args)
    return _run(args)

"""``python -m orchestrator``: the CLI, derived from ``RunConfig``'s fields and docstrings."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import Sequence

from contracts.config_cli import add_dataclass_arguments
from orchestrator.config import PROFILES, ConfigError, RunConfig
from orchestrator.errors import HallulogError
from orchestrator.study_file import StudyFile, StudyFileError, dump_study, load_study

__all__ = ["main", "build_parser", "config_from_args"]

log = logging.getLogger("orchestrator")

_HIDDEN_FIELDS = {"extra"}
_CHOICES = {
    "logging_profile": list(PROFILES),
    "target_layers": ["all", "first_half", "second_half"],
    "sequence_mode": ["all", "prompt", "response", "last"],
    "dtype": ["float16", "float32", "bfloat16"],
    "storage_format": ["npy", "packed", "zarr"],
    "executor": ["local", "ray"],
}


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    from orchestrator.tasks import TASKS

    add_dataclass_arguments(parser, RunConfig, choices={**_CHOICES, "task": TASKS},
                            hidden=_HIDDEN_FIELDS,
                            unset_is_none=True)
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help="Study file (.toml; .yaml/.yml with PyYAML): RunConfig field names "
                             "as keys (k_samples = 5); flags given override it "
                             "(examples/README.md).")
    parser.add_argument("--print-config", action="store_true",
                        help="Print the effective config (defaults < --config < flags) as a "
                             "study file, then exit without running.")
    parser.add_argument("--consolidate-only", action="store_true",
                        help="Only consolidate existing worker outputs, then exit.")
    parser.add_argument("--merge", action="store_true",
                        help="With --consolidate-only and a shard format: physically merge the "
                             "worker stores instead of writing a manifest over them.")
    parser.add_argument("--validate-only", action="store_true",
                        help="Only validate existing artifacts, then exit.")
    parser.add_argument("--deep", action="store_true",
                        help="With --validate-only: also audit every stored activation against "
                             "its token ids (docs/alignment.md); mismatches fail the exit code.")
    parser.add_argument("--retry-failed", action="store_true",
                        help="Reprocess the prompts in errors.jsonl or found incomplete.")
    parser.add_argument("--log-level", default="WARNING",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="Logging level.")
    parser.add_argument("--debug", action="store_true",
                        help="Show the traceback of an error (errors are one line otherwise).")


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (exit 2) pointing at --help, not a usage block."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog="python -m orchestrator",
        description="hallulog: one inference pass producing every artifact hallucination "
                    "detectors need.")
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="Run (or resume) the integrated inference job.")
    _add_run_arguments(run_p)
    status_p = sub.add_parser("status", help="Print a run's status.")
    status_p.add_argument("--url", help="Status API base URL of a running orchestrator.")
    status_p.add_argument("--artifact-root", type=Path,
                          help="Report from the files of a run (finished or not).")
    status_p.add_argument("--token", help="Bearer token of the status API (default: "
                          "$HALLULOG_STATUS_TOKEN, which keeps it out of the process list).")
    status_p.add_argument("--json", action="store_true", help="Print the raw JSON.")
    status_p.add_argument("--debug", action="store_true",
                          help="Show the traceback of an error.")
    from evaluation import add_evaluate_parser

    add_evaluate_parser(sub)
    _add_merge_arguments(sub)
    est_p = sub.add_parser("estimate", help="Project what a run stores (bytes per generation, "
                           "total, time) from the model's shape and the task, before running "
                           "it (docs/budget.md).")
    _add_run_arguments(est_p)
    from orchestrator.estimate import add_estimate_arguments

    add_estimate_arguments(est_p)
    return parser


def _add_merge_arguments(sub) -> None:
    merge_p = sub.add_parser(
        "merge", help="Merge the artifact roots of `run --shard I/N` into one run root.",
        description="Merge shard roots into one root that consolidates, exports and validates "
                    "like a single run. Refuses configs that differ beyond the shard, "
                    "overlapping or missing shards, and unfinished shards.")
    merge_p.add_argument("--out", type=Path, required=True, help="The merged artifact root.")
    merge_p.add_argument("shard_roots", nargs="+", type=Path, metavar="SHARD_ROOT",
                         help="Artifact roots of the shards (every index 0..N-1 once).")
    merge_p.add_argument("--mode", choices=["link", "copy", "move"], default="link",
                         help="How worker directories enter the merged root: hard links "
                              "(default; copies across filesystems), copies, or moved.")
    merge_p.add_argument("--log-level", default="WARNING",
                         choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="Logging level.")


def _merge(args: argparse.Namespace) -> int:
    from orchestrator.commands import _print_validation
    from orchestrator.postrun.merge import merge_shards

    summary = merge_shards(args.out, args.shard_roots, mode=args.mode)
    c = summary["consolidation"]
    print(f"merged {summary['shards']} shards ({summary['worker_dirs']} worker dirs, "
          f"{summary['prompts']} prompts) into {summary['out']}: {c['generations']} "
          f"generations, {c['activations']} activations")
    _print_validation(summary["validation"])
    return 0 if summary["validation"]["ok"] else 1


def _study_file(args: argparse.Namespace) -> StudyFile | None:
    """The ``--config`` study file, checked against the same choices as the flags."""
    if getattr(args, "config", None) is None:
        return None
    from orchestrator.tasks import TASKS

    return load_study(args.config, choices={**_CHOICES, "task": TASKS})


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """A ``RunConfig`` from parsed args: dataclass defaults < the ``--config`` study file <
    the flags given (unset flags parse as None and do not override).

    The post-run commands (``--consolidate-only``, ``--validate-only``, ``--retry-failed``)
    start from the config recorded in the run's manifest, so only ``--artifact-root`` is needed;
    a study file and flags given explicitly still override it.
    """
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(RunConfig)
             if f.name not in _HIDDEN_FIELDS and getattr(args, f.name, None) is not None}
    study = _study_file(args)
    if study is not None:
        given = {**study.values, **given}
    if getattr(args, "consolidate_only", False) or getattr(args, "validate_only", False) \
            or getattr(args, "retry_failed", False):
        from orchestrator.manifest import load_manifest

        manifest = load_manifest(given.get("artifact_root", RunConfig.artifact_root))
        if manifest is not None:
            names = {f.name for f in dataclasses.fields(RunConfig)}
            recorded = {k: tuple(v) if isinstance(v, list) else v
                        for k, v in manifest.get("config", {}).items() if k in names}
            for key in ("artifact_root", "cache_dir", "spool_root"):
                if recorded.get(key) is not None:
                    recorded[key] = Path(recorded[key])
            # --retry-failed starts servers again and spools where the run did; a spool root
            # gone since (a tmpfs after a reboot) falls back to the artifact root's spool/
            if recorded.get("spool_root") is not None and not recorded["spool_root"].is_dir():
                del recorded["spool_root"]
            given = {**recorded, **given}
    if given.get("status_token") is None and os.environ.get("HALLULOG_STATUS_TOKEN"):
        given["status_token"] = os.environ["HALLULOG_STATUS_TOKEN"]
    try:
        return RunConfig(**given)
    except ConfigError as exc:
        if study is None:
            raise
        raise ConfigError(f"{exc} (values from {study.path} and the flags)") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Exit codes: 0 done, 1 an error at run time (one line on stderr; ``--debug`` adds the
    traceback), 2 a bad flag or value, 3 some prompts failed, 130 interrupted."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "status":
        return _status(args, parser)
    if args.command == "evaluate":
        from evaluation import run_evaluate

        return run_evaluate(args)
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    _configure_startup_messages()
    if args.command == "merge":
        try:
            return _merge(args)
        except HallulogError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    try:
        config = config_from_args(args)
    except StudyFileError as exc:  # names the file and key; --help would not help
        print(f"python -m orchestrator run: error: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"python -m orchestrator run: error: {exc} (see python -m orchestrator run --help)",
              file=sys.stderr)
        return 2
    except Exception as exc:  # e.g. an unreadable run_manifest.json of --validate-only
        return _fail(exc, args.debug)
    if args.print_config:
        print(dump_study(config), end="")
        return 0
    try:
        return _run_command(config, args)
    except OSError as exc:
        if exc.filename is None and exc.errno is not None:  # a buffered write names no file
            exc = OSError(exc.errno, exc.strerror, f"a file under {config.artifact_root}"
                          ).with_traceback(exc.__traceback__)
        return _fail(exc, args.debug)
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, or the storage cap (its own message)
        print(str(exc) or "interrupted: committed work is kept; rerun the same command to "
              "resume", file=sys.stderr)
        return 130
    except Exception as exc:
        return _fail(exc, args.debug)


def describe_error(exc: BaseException) -> str:
    """One line for any error: hallulog's own say what and where; OS errors name the path."""
    if isinstance(exc, HallulogError):
        return str(exc)
    if isinstance(exc, OSError) and exc.filename is not None:
        where = f"{exc.filename} -> {exc.filename2}" if exc.filename2 else str(exc.filename)
        return f"{where}: {exc.strerror or type(exc).__name__}"
    text = " ".join(str(exc).split()) or type(exc).__name__
    from storage.errors import StorageError

    return text if isinstance(exc, StorageError) else f"{type(exc).__name__}: {text}"


def _fail(exc: BaseException, debug: bool) -> int:
    if debug:
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    message = describe_error(exc).splitlines() or [""]
    hint = "" if debug or isinstance(exc, HallulogError) else " (--debug shows the traceback)"
    print(f"error: {message[0].rstrip(':')}{hint}", file=sys.stderr)
    if debug and len(message) > 1:  # e.g. a server log's tail (its path is on the first line)
        print("\n".join(message[1:]), file=sys.stderr)
    return 1


def _configure_startup_messages() -> None:
    """What the run is doing before the progress bar appears (model, servers, health), on
    stderr whatever ``--log-level`` says."""
    startup = logging.getLogger("orchestrator.startup")
    if startup.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    startup.addHandler(handler)
    startup.setLevel(logging.INFO)
    startup.propagate = False


def _run_command(config: RunConfig, args: argparse.Namespace) -> int:
    from orchestrator import commands
    from orchestrator.run import run

    if args.command == "estimate":
        from orchestrator.estimate import run_estimate

        return run_estimate(config, args)
    if args.consolidate_only:
        return commands.consolidate_only(config, merge=args.merge)
    if args.validate_only:
        rc = commands.validate_only(config)
        if args.deep:
            from evaluation import run_deep_audit

            rc = max(rc, 0 if run_deep_audit(config.artifact_root)["ok"] else 1)
        return rc
    if args.retry_failed:
        return commands.retry_failed(config)
    result = run(config)
    print(commands.format_result(result))
    if result.failed:
        print(f"{len(result.failed)} prompt(s) failed: see worker_*/errors.jsonl; rerun with "
              "--retry-failed to reprocess them", file=sys.stderr)
        return 3
    return 0


def _status(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from api.client import fetch_status, format_status, status_from_artifacts

    if bool(args.url) == bool(args.artifact_root):
        parser.error("status needs exactly one of --url or --artifact-root")
    try:
        token = args.token or os.environ.get("HALLULOG_STATUS_TOKEN")
        snapshot = fetch_status(args.url, token) if args.url \
            else status_from_artifacts(args.artifact_root)
    except Exception as exc:  # network or file errors: one clear line
        return _fail(exc, args.debug)
    print(json.dumps(snapshot, indent=2) if args.json else format_status(snapshot))
    return 0

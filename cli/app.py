"""``hallulog`` (= ``python -m orchestrator``): the CLI as subcommands.

``run | consolidate | validate | retry | merge | evaluate | import | compare | study | status |
push | pull | estimate | view | export | serve``. The flags of the commands that take a run's
config are derived from ``RunConfig``'s fields, docstrings and types (``contracts/config_cli.py``:
a ``Literal`` field's values are its choices). Every subcommand is one entry of
:data:`SUBCOMMANDS` (name, a function adding its parser to the subparsers, its handler); another
package adds one with :func:`register_subcommand`.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import os
import sys
import typing
from collections.abc import Callable, Sequence
from typing import NamedTuple

from hallulog.cli import parsers as parsers
from hallulog.cli.passthrough import PASSTHROUGH, PASSTHROUGH_SUBCOMMANDS
from hallulog.config.config_file import StudyFile, StudyFileError, dump_study, load_study
from hallulog.config.manifest import recorded_config
from hallulog.config.run_config import ConfigError, RunConfig
from hallulog.contracts.config_cli import literal_choices
from hallulog.contracts.errors import HallulogError
from hallulog.remote.root import artifact_root_problem

__all__ = [
    "main",
    "build_parser",
    "config_from_args",
    "Subcommand",
    "SUBCOMMANDS",
    "register_subcommand",
    "PROG",
]

log = logging.getLogger("hallulog")

PROG = "hallulog"
#: The choices of RunConfig's fields, read from their ``Literal`` types (the flags' and the
#: study file's).
_CHOICES = {name: list(values) for name, values in literal_choices(RunConfig).items()}
#: Commands that work on an existing artifact root: their config starts from the one recorded in
#: its run_manifest.json.
_POST_RUN = ("consolidate", "validate", "retry")


class Subcommand(NamedTuple):
    """One ``hallulog`` subcommand: ``add_parser(subparsers)`` adds (and returns) its parser;
    ``handler(args)`` runs it and returns the exit code."""

    name: str
    add_parser: Callable[[typing.Any], argparse.ArgumentParser]
    handler: Callable[[argparse.Namespace], int]


def _post_run_command(args: argparse.Namespace) -> str | None:
    """The post-run command ``args`` ask for: a post-run subcommand, or ``run`` with one of its
    deprecated flags (``--consolidate-only`` first, as before)."""
    command = getattr(args, "command", None)
    if command in _POST_RUN:
        return command
    for flag, replacement in parsers.DEPRECATED.items():
        if getattr(args, flag, False):
            return replacement
    return None


def _replace_deprecated(args: argparse.Namespace) -> None:
    """``run --consolidate-only`` and the like: one line saying what to use instead; ``args``
    then reads as that subcommand's."""
    if args.command != "run":
        return
    replacement = _post_run_command(args)
    if replacement is None:
        return
    flag = next(f for f, r in parsers.DEPRECATED.items() if r == replacement and getattr(args, f))
    extra = (
        " --merge"
        if replacement == "consolidate" and args.merge
        else " --deep"
        if replacement == "validate" and args.deep
        else ""
    )
    root = args.artifact_root if args.artifact_root is not None else RunConfig.artifact_root
    print(
        f"{PROG} run --{flag.replace('_', '-')} is deprecated: use `{PROG} {replacement} "
        f"--artifact-root {root}{extra}` (doing that now)",
        file=sys.stderr,
    )
    args.command = replacement


def _evaluate(args: argparse.Namespace) -> int:
    from hallulog.evaluation import run_evaluate
    from hallulog.remote.url import object_url

    paths = (args.artifact_root, getattr(args, "train_root", None), args.out)
    if not any(p is not None and object_url(p) for p in paths):
        return run_evaluate(args)
    from hallulog.cli.bucket_commands import evaluate_command

    _configure_logging(args.log_level)
    try:  # a root, --train-root or --out in a bucket (docs/object-storage.md)
        return evaluate_command(args)
    except Exception as exc:
        return _fail(exc, getattr(args, "debug", False))


def _add_import(sub) -> argparse.ArgumentParser:
    from hallulog.evaluation import add_import_parser

    return add_import_parser(sub)


def _import(args: argparse.Namespace) -> int:
    from hallulog.evaluation import run_import

    return run_import(args)


def _merge(args: argparse.Namespace) -> int:
    from hallulog.cli.commands import print_merge
    from hallulog.postrun.merge import merge_shards
    from hallulog.remote.url import object_url

    _configure_logging(args.log_level)
    remote = any(object_url(p) for p in (args.out, *args.shard_roots))
    for p in (args.out, *args.shard_roots):
        if (problem := artifact_root_problem(p, "merge")) is not None:
            print(f"{PROG} merge: error: {problem}", file=sys.stderr)
            return 2
    try:
        if remote:  # shard roots or --out in a bucket (docs/object-storage.md)
            from hallulog.cli.bucket_commands import merge_command

            return merge_command(args)
        summary = merge_shards(args.out, args.shard_roots, mode=args.mode)
    except HallulogError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # the bucket: one line naming it
        return _fail(exc, False)
    print_merge(summary)
    return 0 if summary["validation"]["ok"] else 1


def _status(args: argparse.Namespace) -> int:
    from hallulog.api.client import fetch_status, format_status, status_from_artifacts

    if args.root is not None and args.artifact_root is not None:
        args._parser.error("give the root once: ROOT or --artifact-root")
    root = args.root if args.root is not None else args.artifact_root
    if bool(args.url) == bool(root):
        args._parser.error("status needs exactly one of --url, ROOT or --artifact-root")
    from hallulog.remote.url import object_url

    url = object_url(root) if root is not None else None
    try:
        token = args.token or os.environ.get("HALLULOG_STATUS_TOKEN")
        if args.url:
            snapshot = fetch_status(args.url, token)
        elif url is not None:
            from hallulog.cli.bucket_status import status_from_bucket

            snapshot = status_from_bucket(url)
        else:
            snapshot = status_from_artifacts(root)
    except Exception as exc:  # network or file errors: one clear line
        return _fail(exc, args.debug)
    print(json.dumps(snapshot, indent=2) if args.json else format_status(snapshot))
    if url is not None and not args.json:
        from hallulog.cli.bucket_status import format_lease

        print(format_lease(snapshot))
    return 0


def _lazy(module: str, add: str, run: str) -> tuple[Callable, Callable]:
    """A subcommand whose parser function ``add`` and handler ``run`` live in ``module``,
    imported only when that subcommand is used (``hallulog --help`` stays fast)."""

    def add_parser(sub) -> argparse.ArgumentParser:
        return getattr(importlib.import_module(module), add)(sub)

    def handler(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(module), run)(args)

    return add_parser, handler


SUBCOMMANDS: list[Subcommand] = [
    Subcommand("run", parsers.add_run, lambda args: _config_command(args)),
    Subcommand("consolidate", parsers.add_consolidate, lambda args: _config_command(args)),
    Subcommand("validate", parsers.add_validate, lambda args: _config_command(args)),
    Subcommand("retry", parsers.add_retry, lambda args: _config_command(args)),
    Subcommand("merge", parsers.add_merge, _merge),
    Subcommand("evaluate", parsers.add_evaluate, _evaluate),
    Subcommand("import", _add_import, _import),
    Subcommand("compare", *_lazy("hallulog.study.cli", "add_compare_parser", "run_compare")),
    Subcommand("study", *_lazy("hallulog.cli.study_cli", "add_study_parser", "run_study_command")),
    Subcommand("status", parsers.add_status, _status),
    Subcommand("push", *_lazy("hallulog.cli.push_pull", "add_push_parser", "run_push")),
    Subcommand("pull", *_lazy("hallulog.cli.push_pull", "add_pull_parser", "run_pull")),
    Subcommand("estimate", parsers.add_estimate, lambda args: _config_command(args)),
    Subcommand("view", *_lazy("hallulog.view.command", "add_parser", "run")),
    *PASSTHROUGH_SUBCOMMANDS,
]
"""The subcommands in the order ``--help`` lists them."""


def register_subcommand(
    name: str,
    add_parser: Callable[[typing.Any], argparse.ArgumentParser],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    """Add a subcommand (or replace the one of that name): ``add_parser(subparsers)`` adds its
    parser (``subparsers.add_parser(name, ...)``) and returns it; ``handler(args)`` returns the
    exit code."""
    entry = Subcommand(name, add_parser, handler)
    for i, known in enumerate(SUBCOMMANDS):
        if known.name == name:
            SUBCOMMANDS[i] = entry
            return
    SUBCOMMANDS.append(entry)


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (exit 2) pointing at --help, not a usage block."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog=PROG,
        description="hallulog: one inference pass producing every artifact hallucination "
        "detectors need (also `python -m orchestrator`).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in SUBCOMMANDS:
        p = command.add_parser(sub)
        p.set_defaults(_handler=command.handler, _parser=p)
    return parser


def _study_file(args: argparse.Namespace) -> StudyFile | None:
    """The ``--config`` study file, checked against the same choices as the flags."""
    if getattr(args, "config", None) is None:
        return None
    return load_study(args.config, choices={**_CHOICES, "task": parsers.task_choices()})


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """A ``RunConfig`` from parsed args: dataclass defaults < the ``--config`` study file <
    the flags given (unset flags parse as None and do not override).

    The post-run commands (``consolidate``, ``validate``, ``retry``, and the deprecated flags of
    ``run`` that stand for them) start from the config recorded in the run's manifest, so only
    ``--artifact-root`` is needed; a study file and flags given explicitly still override it.
    """
    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(RunConfig)
        if f.name not in parsers.HIDDEN_FIELDS and getattr(args, f.name, None) is not None
    }
    study = _study_file(args)
    if study is not None:
        given = {**study.values, **given}
    if _post_run_command(args) is not None:
        from hallulog.cli.bucket_staging import root_manifest

        # a local root's, or one in a bucket (the finished root's, else the run's first)
        manifest = root_manifest(given.get("artifact_root", RunConfig.artifact_root))
        if manifest is not None:
            # retry starts servers again and spools where the run did (config.manifest)
            recorded = recorded_config(manifest)
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
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in PASSTHROUGH:  # their own parsers read every flag
        return PASSTHROUGH[argv[0]](argparse.Namespace(args=argv[1:]))
    args = build_parser().parse_args(argv)
    try:
        return args._handler(args)
    except BrokenPipeError:  # `hallulog status | head`: the reader left, nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    _configure_startup_messages()


def _config_command(args: argparse.Namespace) -> int:
    """``run``, ``consolidate``, ``validate``, ``retry``, ``estimate``: the config from the
    flags (and the recorded one), then the command."""
    _configure_logging(args.log_level)
    _replace_deprecated(args)
    prog = f"{PROG} {args.command}"
    try:
        config = config_from_args(args)
    except StudyFileError as exc:  # names the file and key; --help would not help
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"{prog}: error: {exc} (see {prog} --help)", file=sys.stderr)
        return 2
    except Exception as exc:  # e.g. an unreadable run_manifest.json of `validate`
        return _fail(exc, args.debug)
    if args.print_config:
        print(dump_study(config), end="")
        return 0
    try:
        return _run_command(config, args)
    except OSError as exc:
        if exc.filename is None and exc.errno is not None:  # a buffered write names no file
            exc = OSError(
                exc.errno, exc.strerror, f"a file under {config.artifact_root}"
            ).with_traceback(exc.__traceback__)
        return _fail(exc, args.debug)
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, or the storage cap (its own message)
        print(
            str(exc) or "interrupted: committed work is kept; rerun the same command to resume",
            file=sys.stderr,
        )
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
    from hallulog.storage.errors import StorageError

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
    from hallulog.cli import commands
    from hallulog.cli.bucket_commands import remote_command

    if (code := remote_command(config, args)) is not None:  # an s3:// root
        return code
    if args.command == "estimate":
        from hallulog.estimate.command import run_estimate

        return run_estimate(config, args)
    if args.command == "consolidate":
        return commands.consolidate_command(config, merge=args.merge)
    if args.command == "validate":
        return commands.validate_command(config, deep=args.deep)
    if args.command == "retry":
        return commands.retry_command(config)
    from hallulog.orchestrator.run import run

    result = run(config)
    print(commands.format_result(result))
    if result.failed:
        print(
            f"{len(result.failed)} prompt(s) failed: see worker_*/errors.jsonl; "
            f"`{PROG} retry --artifact-root {config.artifact_root}` reprocesses them",
            file=sys.stderr,
        )
        return 3
    return 0

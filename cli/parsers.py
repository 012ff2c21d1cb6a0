"""The ``hallulog`` subcommands' parsers (``hallulog.cli.app`` lists them with their handlers).

The commands that take a run's config (``run``, ``consolidate``, ``validate``, ``retry``,
``estimate``) get one flag per ``RunConfig`` field from ``hallulog.contracts.config_cli``: its docstring is
the help, its ``Literal`` type the choices (the task registry gives ``--task``'s).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hallulog.config.run_config import RunConfig
from hallulog.contracts.config_cli import add_dataclass_arguments

__all__ = [
    "HIDDEN_FIELDS",
    "DEPRECATED",
    "task_choices",
    "add_config_arguments",
    "add_run",
    "add_consolidate",
    "add_validate",
    "add_retry",
    "add_estimate",
    "add_status",
    "add_merge",
    "add_evaluate",
]

HIDDEN_FIELDS = frozenset({"extra"})
"""RunConfig fields without a flag."""


def task_choices() -> list[str]:
    """``--task``'s choices: the task registry's names."""
    from hallulog.tasks import TASKS

    return list(TASKS)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of a command that takes a run's config: one per RunConfig field, the study
    file, and logging."""
    add_dataclass_arguments(
        parser,
        RunConfig,
        choices={"task": task_choices()},
        hidden=HIDDEN_FIELDS,
        unset_is_none=True,
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="Study file (.toml; .yaml/.yml with PyYAML): RunConfig field names "
        "as keys (k_samples = 5); flags given override it "
        "(examples/README.md).",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="Print the effective config (defaults < --config < flags) as a "
        "study file, then exit without running.",
    )
    parser.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="Logging level.",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help="Show the traceback of an error (errors are one line otherwise).",
    )


# ---- deprecated flags of `run` (one release) ------------------------------------------------

DEPRECATED = {  # flag of run → the subcommand that replaces it
    "consolidate_only": "consolidate",
    "validate_only": "validate",
    "retry_failed": "retry",
}


def _add_deprecated_run_flags(parser: argparse.ArgumentParser) -> None:
    old = parser.add_argument_group(
        "deprecated", "Kept for one release; each says what to use instead, then does it."
    )
    old.add_argument(
        "--consolidate-only", action="store_true", help="Deprecated: `hallulog consolidate`."
    )
    old.add_argument(
        "--merge", action="store_true", help="Deprecated: `hallulog consolidate --merge`."
    )
    old.add_argument(
        "--validate-only", action="store_true", help="Deprecated: `hallulog validate`."
    )
    old.add_argument("--deep", action="store_true", help="Deprecated: `hallulog validate --deep`.")
    old.add_argument("--retry-failed", action="store_true", help="Deprecated: `hallulog retry`.")


# ---- the subcommands --------------------------------------------------------------------------


def add_run(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "run",
        help="Run (or resume) the integrated inference job.",
        description="Run (or resume) the integrated inference job: one pass "
        "producing every artifact hallucination detectors need, then "
        "consolidate, export and validate.",
    )
    add_config_arguments(p)
    _add_deprecated_run_flags(p)
    return p


_POST_RUN_NOTE = (
    "The config recorded in ARTIFACT_ROOT/run_manifest.json comes first; a study "
    "file and flags given override it."
)


def add_consolidate(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "consolidate",
        help="Consolidate, export and validate a run's worker outputs.",
        description="Consolidate an artifact root's worker outputs into consolidated/, write "
        "the exports and validate them (what a run does when its queue drains). " + _POST_RUN_NOTE,
    )
    add_config_arguments(p)
    p.add_argument(
        "--merge",
        action="store_true",
        help="With a shard format: physically merge the worker stores instead of "
        "writing a manifest over them.",
    )
    return p


def add_validate(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "validate",
        help="Validate a run's artifacts (exit 1 when they are incomplete).",
        description="Check an artifact root's artifacts against the run's prompts; prints the "
        "problems and the commands that repair them. " + _POST_RUN_NOTE,
    )
    add_config_arguments(p)
    p.add_argument(
        "--deep",
        action="store_true",
        help="Also audit every stored activation against its token ids "
        "(docs/alignment.md); mismatches fail the exit code.",
    )
    return p


def add_retry(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "retry",
        help="Reprocess the prompts in errors.jsonl or found incomplete.",
        description="Run again exactly the prompts that failed (errors.jsonl) or were found "
        "incomplete, then consolidate. " + _POST_RUN_NOTE,
    )
    add_config_arguments(p)
    return p


def add_estimate(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "estimate",
        help="Project what a run stores (bytes per generation, "
        "total, time) from the model's shape and the task, before running "
        "it (docs/budget.md).",
    )
    add_config_arguments(p)
    from hallulog.estimate.command import add_estimate_arguments

    add_estimate_arguments(p)
    return p


def add_status(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("status", help="Print a run's status.")
    p.add_argument(
        "root",
        nargs="?",
        metavar="ROOT",
        help="An artifact root, local or s3://BUCKET/PREFIX (the same as --artifact-root).",
    )
    p.add_argument("--url", help="Status API base URL of a running orchestrator.")
    p.add_argument(
        "--artifact-root",
        help="Report from the files of a run (finished or not); s3://BUCKET/PREFIX reads the "
        "bucket's small objects only (docs/object-storage.md).",
    )
    p.add_argument(
        "--token",
        help="Bearer token of the status API (default: "
        "$HALLULOG_STATUS_TOKEN, which keeps it out of the process list).",
    )
    p.add_argument("--json", action="store_true", help="Print the raw JSON.")
    p.add_argument("--debug", action="store_true", help="Show the traceback of an error.")
    return p


def add_merge(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "merge",
        help="Merge the artifact roots of `run --shard I/N` into one run root.",
        description="Merge shard roots into one root that consolidates, exports and validates "
        "like a single run. Refuses configs that differ beyond the shard, "
        "overlapping or missing shards, and unfinished shards.",
    )
    p.add_argument("--out", type=Path, required=True, help="The merged artifact root.")
    p.add_argument(
        "shard_roots",
        nargs="+",
        type=Path,
        metavar="SHARD_ROOT",
        help="Artifact roots of the shards (every index 0..N-1 once).",
    )
    p.add_argument(
        "--mode",
        choices=["link", "copy", "move"],
        default="link",
        help="How worker directories enter the merged root: hard links "
        "(default; copies across filesystems), copies, or moved.",
    )
    p.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="Logging level.",
    )
    return p


def add_evaluate(sub) -> argparse.ArgumentParser:
    from hallulog.evaluation import add_evaluate_parser

    return add_evaluate_parser(sub)

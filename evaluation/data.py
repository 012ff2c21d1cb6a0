"""Streaming readers of ``consolidated/``: exports, activation index, run manifest.

Only ``consolidated/`` (and, for the audit, ``run_manifest.json`` and the model directory) is
read; the server is never contacted. Files are read line by line; what is kept per prompt is a
handful of numbers (see ``features.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hallulog.contracts import layout
from hallulog.contracts.errors import ArtifactError
from hallulog.contracts.jsonl import iter_lines
from hallulog.contracts.run_manifest import RunManifest

__all__ = ["EvaluationInputError", "Run", "iter_jsonl", "iter_joined"]

EXPORTS = {
    "logprob": layout.LOGPROB_INPUTS,
    "selfcheck": layout.SELFCHECK_SAMPLES,
    "semantic_entropy": layout.SEMANTIC_ENTROPY_INPUTS,
    "semantic_energy": layout.SEMANTIC_ENERGY_INPUTS,
    "geometry": layout.GEOMETRY_INPUTS,
}


class EvaluationInputError(ArtifactError):
    """The run lacks something an evaluation needs; the message says what and how to get it."""


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) of a JSONL file, streamed through :mod:`hallulog.contracts.jsonl` (a torn last
    line is never read; a malformed line is a ``MalformedLineError`` naming file and line).

    A missing file is an :class:`~hallulog.contracts.errors.ArtifactError` naming it."""
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"{path}: missing; re-consolidate with --consolidate-only")
    return ((line.lineno, line.row) for line in iter_lines(path))


class Run:
    """An artifact root seen through its ``consolidated/`` directory."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self.consolidated = layout.consolidated_dir(self.root)
        self.exports = layout.exports_dir(self.root)
        if not self.consolidated.is_dir():
            raise EvaluationInputError(
                f"{self.root}: no consolidated/ directory; run `python -m orchestrator run "
                f"--artifact-root {self.root} --consolidate-only` first"
            )
        if not self.exports.is_dir() or not (self.exports / EXPORTS["logprob"]).is_file():
            raise EvaluationInputError(
                f"{self.exports}: method exports are missing; write them with `python -m "
                f"orchestrator run --artifact-root {self.root} --consolidate-only`"
            )

    def export_path(self, name: str) -> Path:
        return self.exports / EXPORTS[name]

    def has_export(self, name: str) -> bool:
        return self.export_path(name).is_file()

    def manifest(self) -> dict[str, Any]:
        """The run manifest's own keys (``{}`` when the root has none)."""
        manifest = RunManifest.load(self.root)
        return manifest.to_dict() if manifest is not None else {}

    def has_activations(self) -> bool:
        return (self.consolidated / layout.ACTIVATION_INDEX).is_file() and layout.activations_dir(
            self.consolidated
        ).exists()

    def iter_activation_index(self) -> Iterator[tuple[int, dict[str, Any]]]:
        path = self.consolidated / layout.ACTIVATION_INDEX
        if not path.is_file():
            return iter(())
        return iter_jsonl(path)

    def iter_prompt_index(self) -> Iterator[tuple[int, dict[str, Any]]]:
        return iter_jsonl(self.consolidated / layout.PROMPT_INDEX)


def iter_joined(run: Run, names: list[str]) -> Iterator[dict[str, dict[str, Any]]]:
    """One dict ``{export name: row}`` per prompt, reading the exports in lockstep.

    The exports are written together, one line per prompt in the same order
    (exports/methods.py); a line whose prompt_id differs from its neighbours' is an error
    naming the file and line (re-export with ``--consolidate-only``).
    """
    present = [n for n in names if run.has_export(n)]
    iters = {n: iter_jsonl(run.export_path(n)) for n in present}
    while True:
        rows: dict[str, dict[str, Any]] = {}
        lines: dict[str, int] = {}
        for n, it in iters.items():
            nxt = next(it, None)
            if nxt is not None:
                lines[n], rows[n] = nxt
        if not rows:
            return
        if len(rows) != len(iters):
            short = sorted(set(iters) - set(rows))
            raise ArtifactError(
                f"{run.export_path(short[0])}: ends before the other exports; "
                "re-export with --consolidate-only"
            )
        pids = {r.get("prompt_id") for r in rows.values()}
        if len(pids) != 1:
            n = present[-1]
            raise ArtifactError(
                f"{run.export_path(n)}:{lines[n]}: prompt_id differs from the "
                "same line of the other exports; re-export with --consolidate-only"
            )
        yield rows

"""What of a run root the explorer reads, found once: the consolidated Parquet tables, the
manifest, and ``evaluation/`` (report, scores, plots) when ``evaluate`` has run.

A root without ``consolidated/`` or its tables is refused with one line naming the command to
run; a root without ``evaluation/`` opens, and the pages that need it say what to run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hallulog.contracts import layout
from hallulog.contracts.errors import HallulogError
from hallulog.contracts.jsonl import read_document
from hallulog.contracts.run_manifest import RunManifest

__all__ = ["ViewInputError", "RunFiles", "open_run_files", "evaluate_line"]

_PLOT_NAME = re.compile(r"^[\w.-]+\.png$")


class ViewInputError(HallulogError, ValueError):
    """A root the explorer cannot show; the message is one line naming what to run."""


def evaluate_line(root: Path) -> str:
    return (
        f"{root} has no evaluation (report.json, scores.parquet): run "
        f"`hallulog evaluate --artifact-root {root}` for detector scores, rankings and plots"
    )


@dataclass(frozen=True)
class RunFiles:
    root: Path
    prompts: Path
    generations: Path
    labels: Path | None
    manifest: RunManifest | None
    scores: Path | None = None
    report: dict[str, Any] | None = None
    plots: dict[str, Path] = field(default_factory=dict)
    """The PNGs evaluate listed in ``report.json`` (``plots``), by name: the only files a
    request can name."""

    @property
    def evaluation_missing(self) -> str | None:
        return None if self.scores is not None else evaluate_line(self.root)


def open_run_files(root: Path | str) -> RunFiles:
    root = Path(root)
    if not root.is_dir():
        raise ViewInputError(f"{root}: no such directory (give a run's --artifact-root)")
    cons = layout.consolidated_dir(root)
    if not cons.is_dir():
        raise ViewInputError(
            f"{root} has no consolidated/ (not a finished run): run "
            f"`hallulog consolidate --artifact-root {root}`"
        )
    tables = {name: cons / name for name in layout.PARQUET_TABLES}
    manifest = RunManifest.load(root)
    for name in (layout.PROMPTS_PARQUET, layout.GENERATIONS_PARQUET):
        if not tables[name].is_file() and manifest is not None and manifest.get("imported"):
            raise ViewInputError(
                f"{root} is an imported run (hallulog import): it has no {name}, which the "
                "explorer reads; its detector scores are in evaluation/ after `hallulog evaluate`"
            )
        if not tables[name].is_file():
            raise ViewInputError(
                f"{tables[name]} is missing: the explorer reads the Parquet tables that "
                f"consolidation writes; run `hallulog consolidate --artifact-root {root}`"
            )
    labels = tables[layout.LABELS_PARQUET]
    evaluation = layout.evaluation_dir(root)
    scores = evaluation / layout.SCORES
    report_path = evaluation / layout.REPORT_JSON
    if not (scores.is_file() and report_path.is_file()):
        return RunFiles(
            root,
            tables[layout.PROMPTS_PARQUET],
            tables[layout.GENERATIONS_PARQUET],
            labels if labels.is_file() else None,
            manifest,
        )
    report = read_document(report_path, "evaluation report")
    if not isinstance(report, dict):
        raise ViewInputError(f"{report_path}: not a JSON object (rerun `hallulog evaluate`)")
    plots = {
        name: evaluation / name
        for name in report.get("plots") or []
        if isinstance(name, str) and _PLOT_NAME.match(name) and (evaluation / name).is_file()
    }
    return RunFiles(
        root,
        tables[layout.PROMPTS_PARQUET],
        tables[layout.GENERATIONS_PARQUET],
        labels if labels.is_file() else None,
        manifest,
        scores,
        report,
        plots,
    )

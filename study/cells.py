"""The cells a comparison reads: a study's (from its manifest) or loose run roots, each with
its state.

A cell's state, from its files alone (nothing is started):

- ``absent``: no run root yet;
- ``running``: a run root without consolidated method exports (running, killed, or failed);
- ``finished``: consolidated and exported, not evaluated;
- ``evaluated``: ``evaluation/scores.parquet`` is there (``hallulog evaluate`` ran).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hallulog.contracts import layout
from hallulog.contracts.run_manifest import RunManifest
from hallulog.study.manifest import Study, load_study, manifest_path
from hallulog.study.naming import StudyError, slug

__all__ = ["CellRef", "STATES", "cell_state", "study_cells", "root_cells", "scores_path"]

STATES = ("absent", "running", "finished", "evaluated")


@dataclass(frozen=True)
class CellRef:
    """A cell to compare: its name, run root, axis values (empty for a loose root) and the
    fingerprint the study recorded for it (None for a loose root or one not yet known)."""

    name: str
    root: Path
    values: dict
    fingerprint: str | None = None

    @property
    def state(self) -> str:
        return cell_state(self.root)

    def manifest(self) -> RunManifest | None:
        return RunManifest.load(self.root)


def scores_path(root: Path | str) -> Path:
    """A run root's ``evaluation/scores.parquet``."""
    return layout.evaluation_dir(root) / layout.SCORES


def cell_state(root: Path | str) -> str:
    """One of :data:`STATES` (see the module)."""
    root = Path(root)
    if not root.is_dir():
        return "absent"
    if not (layout.exports_dir(root) / layout.LOGPROB_INPUTS).is_file():
        return "running"
    if not scores_path(root).is_file():
        return "finished"
    return "evaluated"


def study_cells(study_root: Path | str) -> tuple[Study, list[CellRef]]:
    """The study's manifest and its cells, in manifest order."""
    study = load_study(study_root)
    return study, [
        CellRef(c.name, c.path(study.root), dict(c.values), c.fingerprint) for c in study.cells
    ]


def root_cells(roots: list[Path | str]) -> list[CellRef]:
    """Loose run roots as cells named after their directories (slugged; a repeated name gets
    ``-2``, ``-3``, ... in argument order). A path that is not a directory, or is a study root,
    is an error naming it."""
    out: list[CellRef] = []
    used: set[str] = set()
    for r in roots:
        root = Path(r)
        if manifest_path(root).is_file():
            raise StudyError(
                f"{root} is a study root: give it alone (`hallulog compare {root}`), not "
                "among run roots"
            )
        if not root.is_dir():
            raise StudyError(f"{root}: no such run root")
        base = slug(root.resolve().name)
        name, i = base, 1
        while name in used:
            i += 1
            name = f"{base}-{i}"
        used.add(name)
        out.append(CellRef(name, root, {}))
    return out

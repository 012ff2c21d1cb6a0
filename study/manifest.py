"""``STUDY/study.json``: the study manifest (docs/formats/study.md).

A study root holds the manifest and one ordinary run root per cell under ``cells/<name>/``;
``hallulog study run`` writes it (:func:`write_study`), ``compare`` and ``study status`` read
it (:func:`load_study`). Unknown keys (of the document and of a cell) are kept on a rewrite; a
manifest from a newer ``study_version`` than :data:`STUDY_VERSION` is refused with one line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from hallulog.contracts import layout
from hallulog.contracts.jsonl import read_document
from hallulog.study.naming import AXES, NAME_RE, StudyError, cell_name

__all__ = [
    "STUDY_VERSION",
    "STUDY_FIELDS",
    "CELL_FIELDS",
    "Cell",
    "Study",
    "load_study",
    "write_study",
    "make_cell",
    "manifest_path",
]

STUDY_VERSION = 1
"""The newest ``study_version`` this code reads and the one it writes."""

#: the manifest's top-level fields: name -> (JSON type, required)
STUDY_FIELDS = {
    "study_version": ("integer", True),
    "axes": ("list of strings", True),
    "cells": ("list of objects", True),
    "source": ("object", False),
}
#: the fields of each entry of ``cells``: name -> (JSON type, required)
CELL_FIELDS = {
    "name": ("string", True),
    "values": ("object", True),
    "root": ("string", True),
    "fingerprint": ("string or null", True),
    "config": ("string", False),
}


def manifest_path(study_root: Path | str) -> Path:
    return Path(study_root) / layout.STUDY_MANIFEST


@dataclass(frozen=True)
class Cell:
    """One cell: its name, axis values (``{axis: value}``), run root (relative to the study
    root, POSIX) and the config fingerprint of its run (None until the study knows it)."""

    name: str
    values: Mapping[str, Any]
    root: str
    fingerprint: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    config: str | None = None
    """The cell's run config file (TOML, ``run --config``), relative to the study root; None
    for a study whose cells were not made by ``hallulog study run``."""

    def path(self, study_root: Path | str) -> Path:
        """The cell's run root on this machine."""
        return Path(study_root) / self.root

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "values": dict(self.values),
            "root": self.root,
            "fingerprint": self.fingerprint,
            **({"config": self.config} if self.config is not None else {}),
            **{k: v for k, v in self.extra.items() if k not in CELL_FIELDS},
        }


@dataclass(frozen=True)
class Study:
    """A study root and its manifest."""

    root: Path
    axes: tuple[str, ...]
    cells: tuple[Cell, ...]
    source: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def cell(self, name: str) -> Cell:
        for c in self.cells:
            if c.name == name:
                return c
        raise StudyError(f"{manifest_path(self.root)}: no cell named {name!r}")


def make_cell(
    values: Mapping[str, Any], fingerprint: str | None = None, *, config: bool = False
) -> Cell:
    """The cell of these axis values: its name by the naming rule, its root ``cells/<name>``
    (and with ``config`` its run config file ``configs/<name>.toml``)."""
    name = cell_name(values)
    return Cell(
        name=name,
        values=dict(values),
        root=f"{layout.STUDY_CELLS}/{name}",
        fingerprint=fingerprint,
        config=f"{layout.STUDY_CONFIGS}/{name}.toml" if config else None,
    )


def _check_cell(path: Path, i: int, raw: Any) -> Cell:
    where = f"{path}: cells[{i}]"
    if not isinstance(raw, dict):
        raise StudyError(f"{where} is not an object")
    for key, (_, required) in CELL_FIELDS.items():
        if required and key not in raw:
            raise StudyError(f"{where} lacks `{key}`")
    name, values, root, fp = raw["name"], raw["values"], raw["root"], raw["fingerprint"]
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise StudyError(f"{where}: name {name!r} is not a cell name (docs/formats/study.md)")
    if not isinstance(values, dict) or set(values) - set(AXES):
        raise StudyError(f"{where}: values must be an object keyed by {', '.join(AXES)}")
    rel = PurePosixPath(root) if isinstance(root, str) else None
    if rel is None or rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise StudyError(f"{where}: root {root!r} must be a path inside the study root")
    if fp is not None and not isinstance(fp, str):
        raise StudyError(f"{where}: fingerprint must be a string or null")
    config = raw.get("config")
    crel = PurePosixPath(config) if isinstance(config, str) else None
    if config is not None and (crel is None or crel.is_absolute() or ".." in crel.parts):
        raise StudyError(f"{where}: config {config!r} must be a path inside the study root")
    extra = {k: v for k, v in raw.items() if k not in CELL_FIELDS}
    return Cell(name, values, str(rel), fp, extra, config)


def load_study(study_root: Path | str) -> Study:
    """The study at ``study_root``; a missing or malformed manifest is one line naming it."""
    root = Path(study_root)
    path = manifest_path(root)
    doc = read_document(path, "study manifest")
    if doc is None:
        raise StudyError(
            f"{root}: no {layout.STUDY_MANIFEST} (not a study root; `hallulog study run` makes "
            "one, or compare run roots with `hallulog compare --out DIR ROOT ...`)"
        )
    if not isinstance(doc, dict):
        raise StudyError(f"{path}: not a JSON object")
    for key, (_, required) in STUDY_FIELDS.items():
        if required and key not in doc:
            raise StudyError(f"{path}: lacks `{key}`")
    version = doc["study_version"]
    if isinstance(version, bool) or not isinstance(version, int) or version > STUDY_VERSION:
        raise StudyError(
            f"{path}: study_version {version!r} is newer than this hallulog reads "
            f"({STUDY_VERSION}); upgrade hallulog"
        )
    axes = doc["axes"]
    if not isinstance(axes, list) or any(a not in AXES for a in axes):
        raise StudyError(f"{path}: axes must be a list of {', '.join(AXES)}")
    if not isinstance(doc["cells"], list):
        raise StudyError(f"{path}: cells must be a list")
    cells = [_check_cell(path, i, c) for i, c in enumerate(doc["cells"])]
    seen: set[str] = set()
    for c in cells:
        if c.name in seen:
            raise StudyError(f"{path}: two cells are named {c.name!r}")
        seen.add(c.name)
    source = doc.get("source")
    if source is not None and not isinstance(source, dict):
        raise StudyError(f"{path}: source must be an object")
    extra = {k: v for k, v in doc.items() if k not in STUDY_FIELDS}
    return Study(root, tuple(axes), tuple(cells), source, extra)


def write_study(
    study_root: Path | str,
    cells: list[Cell],
    *,
    axes: list[str] | None = None,
    source: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write (atomically: ``.partial``, fsync, rename) the manifest of ``cells``; ``axes``
    default to those the cells' values use, in axis order."""
    root = Path(study_root)
    names = [c.name for c in cells]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise StudyError(f"{root}: two cells are named {dup!r}")
    used = {a for c in cells for a in c.values}
    doc: dict[str, Any] = {
        "study_version": STUDY_VERSION,
        "axes": list(axes) if axes is not None else [a for a in AXES if a in used],
        "cells": [c.to_dict() for c in cells],
    }
    if source is not None:
        doc["source"] = dict(source)
    for k, v in (extra or {}).items():
        doc.setdefault(k, v)
    root.mkdir(parents=True, exist_ok=True)
    path = manifest_path(root)
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path

"""Cell names: made from a cell's axis values, readable, filesystem-safe, unique and stable.

The rule (docs/formats/study.md, "Cell names"):

- each axis value gives a *label*: a table's ``name`` key when it has one; otherwise a model
  (a string: a path or a hub id) the last component of its path, a task table its ``task``
  value (+ ``-`` the stem of its ``task_path``; + ``-`` 8 hex digits of the table's hash when it
  holds other keys), a prompt table ``prompt-`` + 8 hex digits of its hash, a seed ``seed<N>``;
- a label is *slugged*: lower case, every character outside ``a-z 0-9 . _ -`` a ``-``, runs of
  ``-`` or ``_`` one character, no ``-``, ``.`` or ``_`` at either end, at most 48 characters;
- the cell's name is its labels in axis order (model, task, prompt, seed) joined by ``__``
  (a label holds no ``__``); a study without axes has one cell, ``cell``.

A label depends on its value alone, so adding a value to an axis never renames another cell;
two values of one axis with the same label are refused (:func:`check_labels`), naming both.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from hallulog.contracts.errors import HallulogError

__all__ = [
    "AXES",
    "AXIS_KEYS",
    "NAME_KEY",
    "StudyError",
    "slug",
    "value_hash",
    "axis_label",
    "cell_name",
    "check_labels",
    "NAME_RE",
]

AXES = ("model", "task", "prompt", "seed")
"""The axes of a study, in the order their labels make a cell name."""
AXIS_KEYS = {"model": "models", "task": "tasks", "prompt": "prompts", "seed": "seeds"}
"""Each axis's key in a study file's ``[axes]`` table."""
NAME_KEY = "name"
"""The key of an axis table (a model, task or prompt) that names it in cell names only."""
SEPARATOR = "__"
MAX_LABEL = 48
NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?$")
"""What every cell name matches (and a ``..`` or ``/`` never appears in one)."""


class StudyError(HallulogError, ValueError):
    """A study root, its manifest or its axis values are wrong; the message says where."""


def slug(text: str) -> str:
    """``text`` as a filesystem-safe label (see the module's rule); ``x`` when nothing is left."""
    s = re.sub(r"[^a-z0-9._-]", "-", str(text).lower())
    s = re.sub(r"-+", "-", re.sub(r"_+", "_", s)).strip("-._")
    s = s[:MAX_LABEL].strip("-._")
    return s or "x"


def value_hash(value: Any) -> str:
    """8 hex digits of the SHA-256 of the value's canonical JSON (sorted keys, compact)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _model_label(value: Any) -> str:
    if isinstance(value, Mapping):
        if value.get(NAME_KEY):
            return slug(value[NAME_KEY])
        value = value.get("model", "")
    parts = [p for p in PurePosixPath(str(value).replace("\\", "/")).parts if p != "/"]
    return slug(parts[-1] if parts else value)


def _task_label(value: Mapping[str, Any]) -> str:
    if value.get(NAME_KEY):
        return slug(value[NAME_KEY])
    label = str(value.get("task", "task"))
    if value.get("task_path"):
        label += "-" + PurePosixPath(str(value["task_path"]).replace("\\", "/")).stem
    if set(value) - {"task", "task_path", NAME_KEY}:
        label += "-" + value_hash(dict(value))
    return slug(label)


def axis_label(axis: str, value: Any) -> str:
    """The label of one axis value (see the module's rule)."""
    if axis == "model":
        return _model_label(value)
    if axis == "task":
        if not isinstance(value, Mapping):
            raise StudyError(f"axis tasks: {value!r} is not a table of task keys")
        return _task_label(value)
    if axis == "prompt":
        if not isinstance(value, Mapping):
            raise StudyError(f"axis prompts: {value!r} is not a table of prompt keys")
        if value.get(NAME_KEY):
            return slug(value[NAME_KEY])
        return "prompt-" + value_hash(dict(value))
    if axis == "seed":
        if isinstance(value, bool) or not isinstance(value, int):
            raise StudyError(f"axis seeds: {value!r} is not an integer")
        return f"seed{value}"
    raise StudyError(f"unknown axis {axis!r}; the axes are {', '.join(AXES)}")


def cell_name(values: Mapping[str, Any]) -> str:
    """The name of the cell with these axis values (``{axis: value}``, any axis absent)."""
    unknown = set(values) - set(AXES)
    if unknown:
        raise StudyError(f"unknown axis {sorted(unknown)[0]!r}; the axes are {', '.join(AXES)}")
    labels = [axis_label(a, values[a]) for a in AXES if a in values]
    return SEPARATOR.join(labels) if labels else "cell"


def check_labels(axis: str, values: list[Any]) -> list[str]:
    """The labels of one axis's values; two different values with one label are an error."""
    seen: dict[str, Any] = {}
    out = []
    for v in values:
        label = axis_label(axis, v)
        if label in seen and seen[label] != v:
            raise StudyError(
                f"axis {AXIS_KEYS[axis]}: {seen[label]!r} and {v!r} both make the cell label "
                f"{label!r}; give one of them a distinct `{NAME_KEY}`"
            )
        seen[label] = v
        out.append(label)
    return out

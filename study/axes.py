"""A study file's ``[axes]`` table: its cells (the product of the axes) and each cell's run keys.

``[axes]`` holds any of ``models`` (a list of ``model`` values: strings, or tables with
``model`` and a ``name``), ``tasks`` (a list of tables of task keys: ``task``, ``task_path``,
the field-mapping keys, ...), ``prompts`` (a list of tables of prompt keys:
``prompt_template``, ``chat``, ``fewshot_k``, ...) and ``seeds`` (a list of integers). The cells
are the product of the axes given, in axis order (model, task, prompt, seed), the last axis
varying fastest; a study without axes has one cell. A table's ``name`` key only names its cells
(docs/formats/study.md "Cell names"); the other keys are the cell's run keys, laid over the
study file's shared keys (:func:`cell_keys`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from hallulog.study.naming import AXES, AXIS_KEYS, NAME_KEY, StudyError, check_labels

__all__ = ["AXES_TABLE", "axis_values", "study_cell_values", "cell_keys"]

AXES_TABLE = "axes"
"""The study file's table of axes; every other key is shared by the cells."""


def _model(where: str, value: Any) -> Any:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, Mapping) and isinstance(value.get("model"), str) and value["model"]:
        unknown = set(value) - {"model", NAME_KEY}
        if unknown:
            raise StudyError(
                f"{where}: a model table holds `model` and `name` only, not {sorted(unknown)[0]!r}"
            )
        return dict(value)
    raise StudyError(f"{where}: {value!r} is not a model (a path or hub id, or a table with model)")


def axis_values(path: str, axes: Any) -> dict[str, list[Any]]:
    """``{axis: [values]}`` of the ``[axes]`` table of the file at ``path`` (only the axes it
    gives); one line naming the file and the axis when a value has the wrong shape."""
    if axes is None:
        return {}
    if not isinstance(axes, Mapping):
        raise StudyError(
            f"{path}: [{AXES_TABLE}] must be a table of {', '.join(AXIS_KEYS.values())}"
        )
    keys = {v: k for k, v in AXIS_KEYS.items()}
    unknown = set(axes) - set(keys)
    if unknown:
        raise StudyError(
            f"{path}: [{AXES_TABLE}] has no axis {sorted(unknown)[0]!r}; the axes are "
            f"{', '.join(AXIS_KEYS.values())}"
        )
    out: dict[str, list[Any]] = {}
    for axis in AXES:
        key = AXIS_KEYS[axis]
        if key not in axes:
            continue
        raw = axes[key]
        where = f"{path}: {AXES_TABLE}.{key}"
        if not isinstance(raw, list) or not raw:
            raise StudyError(f"{where} must be a non-empty list")
        values = []
        for i, v in enumerate(raw):
            at = f"{where}[{i}]"
            if axis == "model":
                v = _model(at, v)
            elif axis in ("task", "prompt"):
                if not isinstance(v, Mapping):
                    raise StudyError(f"{at}: {v!r} is not a table of {axis} keys")
                v = dict(v)
                if axis == "task" and not isinstance(v.get("task"), str):
                    raise StudyError(f"{at}: a task table needs `task` (a task name)")
            elif isinstance(v, bool) or not isinstance(v, int):
                raise StudyError(f"{at}: {v!r} is not an integer seed")
            values.append(v)
        try:
            check_labels(axis, values)
        except StudyError as exc:
            raise StudyError(f"{path}: {exc}") from None
        out[axis] = values
    return out


def study_cell_values(path: str, axes: Any) -> list[dict[str, Any]]:
    """The axis values of each cell (``{axis: value}``), in run order."""
    given = axis_values(path, axes)
    names = list(given)
    return [dict(zip(names, combo)) for combo in itertools.product(*given.values())]


def cell_keys(values: Mapping[str, Any]) -> dict[str, Any]:
    """The run keys (RunConfig field names) one cell's axis values set."""
    keys: dict[str, Any] = {}
    for axis in AXES:
        if axis not in values:
            continue
        v = values[axis]
        if axis == "model":
            keys["model"] = v["model"] if isinstance(v, Mapping) else v
        elif axis == "seed":
            keys["seed"] = v
        else:
            keys.update({k: x for k, x in v.items() if k != NAME_KEY})
    return keys

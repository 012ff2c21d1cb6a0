"""Study files: one TOML (or YAML) file holding a run's ``RunConfig`` values (``--config``).

Layout: flat top-level keys named like ``RunConfig``'s fields (``k_samples = 5``,
``gpus = [0, 1]``), plus an optional ``[extra]`` table of free-form values recorded in the
manifest. Values are checked with the type and choices the CLI gives the same field's flag
(``hallulog.contracts.config_cli``); ``task_path``, ``fewshot_path`` and ``prompt_template_file`` are
resolved against the file's directory, every other path against the working directory (as
flags are). :func:`dump_study` writes a config back as TOML that :func:`load_study` reads to the
same values (``--print-config``).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import os
import re
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tomllib
from hallulog.config.run_config import SECRET_FIELDS, ConfigError, RunConfig
from hallulog.contracts.config_cli import argument_for, int_list, parse_bool, str_list
from hallulog.contracts.extras import MissingExtra, require

__all__ = [
    "StudyFile",
    "StudyFileError",
    "load_study",
    "read_file",
    "file_values",
    "dump_study",
    "FILE_RELATIVE_FIELDS",
    "PROVENANCE_KEYS",
]

#: Path fields resolved against the study file's directory (inputs that travel with the study).
FILE_RELATIVE_FIELDS = ("task_path", "fewshot_path", "prompt_template_file")
#: Keys the loader adds to ``extra`` (recorded in the manifest; left out by :func:`dump_study`).
PROVENANCE_KEYS = ("config_file", "config_file_sha256")
_NOT_IN_FILE = SECRET_FIELDS  # status_token: only by flag or $HALLULOG_STATUS_TOKEN


class StudyFileError(ConfigError):
    """A study file cannot be read or holds a bad key or value; the message names the file."""


@dataclasses.dataclass(frozen=True)
class StudyFile:
    """A study file read and checked: ``values`` are RunConfig keyword arguments."""

    path: Path
    sha256: str
    values: dict[str, Any]


def _fail(path: Path, message: str) -> StudyFileError:
    return StudyFileError(f"{path}: {message}")


def _read(path: Path, data: bytes) -> Any:
    if path.suffix in (".yaml", ".yml"):
        try:
            yaml = require("yaml", f"reading {path}")
        except MissingExtra as exc:
            raise StudyFileError(str(exc)) from None
        try:
            return yaml.safe_load(data.decode("utf-8"))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f":{mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc)
            raise StudyFileError(f"{path}{where}: malformed YAML ({problem})") from None
    if path.suffix != ".toml":
        raise _fail(path, "a study file ends in .toml, .yaml or .yml")
    try:
        return tomllib.loads(data.decode("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise StudyFileError(f"{path}: malformed TOML ({exc})") from None


def _expected(annotation: Any, choices: Sequence[Any] | None) -> tuple[type | str, str]:
    """(the Python kind a file value must have, its description) for a field's annotation."""
    if choices:
        return "choice", "one of " + ", ".join(map(str, choices))
    conv = argument_for(annotation)["type"]
    table: dict[Any, tuple[type | str, str]] = {
        parse_bool: (bool, "true or false"),
        int: (int, "an integer"),
        float: (float, "a number"),
        str: (str, "a string"),
        Path: (Path, "a path (a string)"),
        int_list: ("ints", "a list of integers"),
        str_list: ("strs", "a list of strings"),
    }
    return table[conv]


def _convert(value: Any, annotation: Any, choices: Sequence[Any] | None) -> Any:
    """``value`` as the field's type, or ValueError naming the expected type."""
    optional = type(None) in typing.get_args(annotation)
    kind, described = _expected(annotation, choices)
    if value is None:  # YAML's null: only where the field itself may be None
        if optional:
            return None
        raise ValueError(described)
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if kind == "choice":
        ok = value in choices and type(value) is type(choices[0])  # type: ignore[index]
    elif kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = is_int
    elif kind is float:
        ok = is_int or isinstance(value, float)
        value = float(value) if ok else value
    elif kind in (str, Path):
        ok = isinstance(value, str)
        value = Path(value).expanduser() if ok and kind is Path else value
    else:  # a list (tuple field)
        item = int if kind == "ints" else str
        ok = isinstance(value, list) and all(
            isinstance(v, item) and not isinstance(v, bool) for v in value
        )
        value = tuple(value) if ok else value
    if not ok:
        raise ValueError(described)
    return value


def _check_extra(path: Path, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(path, "extra: expected a table of free-form values")
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise _fail(
            path, f"extra: values must be strings, numbers, booleans, lists and tables ({exc})"
        ) from None
    return dict(value)


def load_study(
    path: str | os.PathLike[str], *, choices: Mapping[str, Sequence[Any]] | None = None
) -> StudyFile:
    """Read and check the study file at ``path``.

    ``choices``: allowed values of fields beyond their ``Literal`` annotations (the CLI's).
    Raises StudyFileError with one line naming the file and the key: an unknown key (with the
    closest field name), a value of the wrong type or outside the field's choices.
    """
    path, data, doc = read_file(path)
    sha = hashlib.sha256(data).hexdigest()
    return StudyFile(path=path, sha256=sha, values=file_values(path, doc, sha, choices=choices))


def read_file(path: str | os.PathLike[str]) -> tuple[Path, bytes, dict[str, Any]]:
    """(path, bytes, document) of a TOML or YAML file holding a mapping; StudyFileError (one
    line naming the file) when it cannot be read or parsed."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _fail(path, exc.strerror or type(exc).__name__) from None
    doc = _read(path, data)
    if doc is None:
        doc = {}  # an empty YAML file
    if not isinstance(doc, dict):
        raise _fail(path, "expected a mapping of RunConfig field names to values")
    return path, data, doc


def file_values(
    path: Path,
    doc: Mapping[str, Any],
    sha: str,
    *,
    choices: Mapping[str, Sequence[Any]] | None = None,
) -> dict[str, Any]:
    """The RunConfig keyword arguments of the mapping ``doc`` read from ``path`` (its keys
    checked as :func:`load_study` checks them; paths of :data:`FILE_RELATIVE_FIELDS` resolved
    against ``path``'s directory; ``extra`` given the file's provenance)."""
    hints = typing.get_type_hints(RunConfig)
    fields = [f.name for f in dataclasses.fields(RunConfig) if f.name not in _NOT_IN_FILE]
    base = Path(os.path.abspath(path)).parent
    values: dict[str, Any] = {}
    for key, value in doc.items():
        if key not in fields:
            close = difflib.get_close_matches(str(key).replace("-", "_"), fields, n=1)
            hint = (
                f" (did you mean {close[0]!r}?)"
                if close
                else " (keys are RunConfig field names: python -m orchestrator run --help)"
            )
            if key in _NOT_IN_FILE:
                hint = " (secret: pass it as $HALLULOG_STATUS_TOKEN, never in a file)"
            raise _fail(path, f"unknown key {key!r}{hint}")
        if key == "extra":
            values[key] = _check_extra(path, value)
            continue
        allowed = (choices or {}).get(key) or argument_for(hints[key]).get("choices")
        try:
            value = _convert(value, hints[key], allowed)
        except ValueError as exc:
            raise _fail(path, f"{key} = {value!r}: expected {exc}") from None
        if key in FILE_RELATIVE_FIELDS and value is not None:
            value = os.path.abspath(base / Path(value).expanduser())  # absolute: kept
        values[key] = value
    values["extra"] = {
        **values.get("extra", {}),
        "config_file": str(base / path.name),
        "config_file_sha256": sha,
    }
    return values


# ---- writing ---------------------------------------------------------------------------------

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else _string(key)


def _escape_control(text: str) -> str:
    return _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _string(text: str) -> str:
    if "\n" in text:  # multi-line basic string: templates stay readable
        body = text.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "\\r")
        return '"""\n' + _escape_control(body) + '"""'
    return _escape_control(json.dumps(text, ensure_ascii=False))


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (str, Path)):
        return _string(str(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{"
            + ", ".join(f"{_key(str(k))} = {_value(v)}" for k, v in value.items() if v is not None)
            + "}"
        )
    raise TypeError(f"no TOML form for {type(value).__name__}")


def dump_study(config: RunConfig) -> str:
    """``config`` as a study file (TOML) that :func:`load_study` reads back to it.

    None values are left out (TOML has none; every field that may be None defaults to None),
    and so are ``status_token`` and ``extra``'s :data:`PROVENANCE_KEYS`.
    """
    lines = ["# python -m orchestrator run --config FILE (written by --print-config)"]
    extra: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name == "extra":
            extra = {k: v for k, v in value.items() if k not in PROVENANCE_KEYS}
        elif value is not None and f.name not in _NOT_IN_FILE:
            lines.append(f"{f.name} = {_value(value)}")
    if extra:
        lines += ["", "[extra]"]
        lines += [f"{_key(str(k))} = {_value(v)}" for k, v in extra.items() if v is not None]
    return "\n".join(lines) + "\n"

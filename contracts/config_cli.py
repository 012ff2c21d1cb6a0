"""A frozen config dataclass → argparse flags: the one generator every entry point uses.

Each field becomes ``--field-name``; its help is the field's ``metadata["help"]`` or else the
docstring written under the field; its type comes from the annotation (``bool`` takes
``true/false``, ``tuple[int, ...]`` a comma-separated list with inclusive ranges (``0-7``,
``0,2-3``), ``Literal`` its values as choices). The same ``Literal`` types check the values in
``__post_init__`` (:func:`literal_problem`), so a choice is written once: in the type.

Field metadata: ``help`` (else the docstring), and argparse's ``metavar``, ``type``, ``choices``,
``nargs``, ``action``, ``const``; other keys (e.g. the orchestrator's fingerprint membership)
are the dataclass's own business.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "add_dataclass_arguments",
    "field_docs",
    "parse_bool",
    "literal_choices",
    "literal_problem",
    "flag_name",
    "argument_for",
    "int_list",
    "str_list",
]

_ARGPARSE_KEYS = frozenset({"metavar", "type", "choices", "nargs", "action", "const"})


def field_docs(cls: type) -> dict[str, str]:
    """Docstrings written under each field of dataclass ``cls`` (whitespace folded)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
        ):
            docs[node.target.id] = " ".join(str(nxt.value.value).split())
    return docs


def parse_bool(text: str) -> bool:
    """``true/false/yes/no/on/off/1/0`` for boolean flags (``--resume false``)."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def int_list(text: str) -> tuple[int, ...]:
    """``0,2,5`` and inclusive ranges ``0-7`` / ``0,2-3`` (``-1`` alone is the integer -1)."""
    out: list[int] = []
    for part in (x.strip() for x in text.split(",")):
        if not part:
            continue
        low, sep, high = part[1:].partition("-")  # a leading minus belongs to the number
        try:
            if sep:
                first, last = int(part[0] + low), int(high)
                if last < first:
                    raise ValueError
                out.extend(range(first, last + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated integers or ranges (0,2-3), got {text!r}"
            ) from None
    return tuple(out)


def str_list(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def flag_name(name: str) -> str:
    """The flag of field ``name``: ``storage_format`` → ``--storage-format``."""
    return "--" + name.replace("_", "-")


def _literal_args(annotation: Any) -> tuple[Any, ...] | None:
    """The values of a ``Literal[...]`` annotation (also inside ``X | None``), else None."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        found = [v for a in args if a is not type(None) for v in (_literal_args(a) or ())]
        return tuple(found) or None
    if origin is typing.Literal:
        return args
    return None


def literal_choices(cls: type) -> dict[str, tuple[Any, ...]]:
    """The allowed values of each ``Literal``-typed field of dataclass ``cls``, by field name."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        values = _literal_args(hints[f.name])
        if values is not None:
            out[f.name] = values
    return out


def literal_problem(obj: Any) -> str | None:
    """For a dataclass instance: the first ``Literal``-typed field whose value is not one of
    its type's values, as one line naming the flag and the choices (None when every value is
    allowed; None itself is allowed where the type says ``| None``)."""
    for name, values in _literal_fields(type(obj)).items():
        value = getattr(obj, name)
        if value is None and _optional(type(obj), name):
            continue
        if value not in values:
            return f"{flag_name(name)}: {value!r} is not one of {', '.join(map(str, values))}"
    return None


_LITERALS: dict[type, dict[str, tuple[Any, ...]]] = {}
_OPTIONAL: dict[type, frozenset[str]] = {}


def _literal_fields(cls: type) -> dict[str, tuple[Any, ...]]:
    if cls not in _LITERALS:  # type hints are resolved once per class
        hints = typing.get_type_hints(cls)
        _LITERALS[cls] = literal_choices(cls)
        _OPTIONAL[cls] = frozenset(
            name
            for name in _LITERALS[cls]
            if typing.get_origin(hints[name]) in (typing.Union, types.UnionType)
            and type(None) in typing.get_args(hints[name])
        )
    return _LITERALS[cls]


def _optional(cls: type, name: str) -> bool:
    return name in _OPTIONAL[cls]


def argument_for(annotation: Any) -> dict[str, Any]:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return argument_for(inner[0])
    if origin is typing.Literal:
        return {"type": type(args[0]), "choices": list(args)}
    if origin is tuple:
        return {"type": int_list if args and args[0] is int else str_list}
    if annotation is bool:
        return {"type": parse_bool, "metavar": "{true,false}"}
    if annotation in (int, float, str, Path):
        return {"type": annotation}
    raise TypeError(f"no CLI mapping for {annotation!r}")


def add_dataclass_arguments(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    choices: Mapping[str, Iterable[str]] | None = None,
    hidden: Iterable[str] = (),
    unset_is_none: bool = False,
) -> None:
    """Add one ``--flag`` per field of dataclass ``cls`` to ``parser``.

    ``unset_is_none``: flags not given parse as None (so that a caller can layer them over
    other sources, e.g. a recorded config), else they parse as the field's default.
    """
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    skip = set(hidden)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        kwargs = argument_for(hints[f.name])
        kwargs.update({k: v for k, v in f.metadata.items() if k in _ARGPARSE_KEYS})
        if choices and f.name in choices:
            kwargs["choices"] = list(choices[f.name])
        default = f.default if f.default is not dataclasses.MISSING else None
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        text = f.metadata.get("help") or docs.get(f.name, "")
        if "default" not in text:
            text = f"{text} (default: {shown})"
        parser.add_argument(
            flag_name(f.name),
            dest=f.name,
            default=None if unset_is_none else default,
            help=text,
            **kwargs,
        )

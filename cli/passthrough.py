"""Subcommands whose own parser reads the rest of the line: ``hallulog export`` (the exports'
CLI) and ``hallulog serve`` (the embedded server)."""

from __future__ import annotations

import argparse
import typing
from collections.abc import Callable
from typing import NamedTuple

__all__ = ["PASSTHROUGH", "PASSTHROUGH_SUBCOMMANDS"]


class _Entry(NamedTuple):
    name: str
    add_parser: Callable[[typing.Any], argparse.ArgumentParser]
    handler: Callable[[argparse.Namespace], int]


def _parser(name: str, help: str) -> Callable[[typing.Any], argparse.ArgumentParser]:
    """Its entry in ``hallulog --help``; ``hallulog.cli.app`` hands it its arguments untouched."""

    def add(sub) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, add_help=False)
        p.add_argument("args", nargs=argparse.REMAINDER)
        return p

    return add


def _export(args: argparse.Namespace) -> int:
    from hallulog.exports.cli import main

    return main(args.args)


def _serve(args: argparse.Namespace) -> int:
    from hallulog.serving.__main__ import main

    return main(args.args)


PASSTHROUGH_SUBCOMMANDS = (
    _Entry(
        "export",
        _parser("export", "wds, saev, saelens, sft, lm-polygraph or uqlm export (docs/exports.md)"),
        _export,
    ),
    _Entry(
        "serve", _parser("serve", "the embedded OpenAI-compatible server (docs/serving.md)"), _serve
    ),
)
PASSTHROUGH: dict[str, Callable[[argparse.Namespace], int]] = {
    e.name: e.handler for e in PASSTHROUGH_SUBCOMMANDS
}

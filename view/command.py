"""``hallulog view ROOT``: serve the explorer of a run or study root, or ``--export DIR`` it as
static HTML. Every error is one line (a root the explorer cannot show names the command to
run; a missing duckdb names the install line)."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from pathlib import Path

from hallulog.contracts.errors import HallulogError
from hallulog.contracts.extras import require
from hallulog.view.defaults import (
    DEFAULT_EXPORT_LIMIT,
    DEFAULT_MEMORY_LIMIT,
    DEFAULT_PORT,
    TOKEN_ENV,
)

__all__ = ["add_parser", "run"]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "view",
        help="browse a finished run (or a study) in the browser, or export it as static HTML "
        "(docs/view.md)",
        description="The results explorer: the run, its questions (paged, sortable, "
        "filterable), one question's answers token by token and every detector's score, a "
        "study's compare table and transfer heatmaps.",
    )
    p.add_argument("root", type=Path, help="a run's artifact root, or a study root")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (0: a free one)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="interface; anything but loopback requires --token",
    )
    p.add_argument(
        "--token",
        default=None,
        help=f"require this bearer token (default: ${TOKEN_ENV}); open /login#token=TOKEN",
    )
    p.add_argument("--export", type=Path, default=None, metavar="DIR", help="write static HTML")
    p.add_argument(
        "--export-limit",
        type=int,
        default=DEFAULT_EXPORT_LIMIT,
        metavar="N",
        help=f"questions per filter in the export (default {DEFAULT_EXPORT_LIMIT})",
    )
    p.add_argument(
        "--memory-limit",
        default=DEFAULT_MEMORY_LIMIT,
        help="DuckDB's memory limit for the question tables (it spills to a temporary "
        "directory beyond it)",
    )
    p.add_argument("--debug", action="store_true", help="tracebacks on errors")
    return p


_SIZE = re.compile(r"^\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)$", re.IGNORECASE)


def _fail(message: str, code: int = 1) -> int:
    print(f"hallulog view: error: {message}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING)
    token = args.token or os.environ.get(TOKEN_ENV) or None
    if not _SIZE.match(args.memory_limit.strip()):
        return _fail(f"--memory-limit {args.memory_limit!r}: a size such as 512MB or 2GB", 2)
    if args.export_limit < 1:
        return _fail(f"--export-limit must be >= 1, got {args.export_limit}", 2)
    try:
        require("duckdb", "hallulog view")
        if args.export is not None:
            from hallulog.view.export import export_site

            done = export_site(
                args.root, args.export, limit=args.export_limit, memory_limit=args.memory_limit
            )
            parts = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in done.items())
            print(f"exported {args.root} to {args.export / 'index.html'} ({parts})")
            return 0
        from hallulog.view.app import create_app
        from hallulog.view.auth import require_token_off_loopback
        from hallulog.view.server import ViewServer

        try:
            require_token_off_loopback(args.host, token)
        except ValueError as exc:
            return _fail(str(exc), 2)
        app = create_app(args.root, token=token, memory_limit=args.memory_limit)
        run_site = app.state.sites.get("")  # a run root (a study opens its cells later)
        if run_site is not None and run_site.index().files.evaluation_missing:
            print(f"note: {run_site.index().files.evaluation_missing}", file=sys.stderr)
        server = ViewServer(app, args.host, args.port, token)
        login = "login#token=TOKEN  (TOKEN: the one given)" if token else ""
        try:
            server.serve(
                lambda url: print(f"hallulog view: {url}{login}  (Ctrl-C stops)", flush=True)
            )
        except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it handled: a clean stop
            pass
        return 0
    except (HallulogError, OSError, ValueError) as exc:
        if args.debug:
            raise
        return _fail(str(exc))

"""The explorer's defaults, shared by the command line, the app and the static export (kept
here so that ``hallulog --help`` imports nothing heavy)."""

from __future__ import annotations

__all__ = ["DEFAULT_PORT", "DEFAULT_EXPORT_LIMIT", "DEFAULT_MEMORY_LIMIT", "TOKEN_ENV"]

DEFAULT_PORT = 8765
DEFAULT_EXPORT_LIMIT = 100
"""``--export-limit``: questions per filter in the static export."""
DEFAULT_MEMORY_LIMIT = "512MB"
"""``--memory-limit``: DuckDB's memory for the question tables (beyond it, it spills to disk)."""
TOKEN_ENV = "HALLULOG_VIEW_TOKEN"

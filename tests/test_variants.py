"""Variants through one type or registry, never by comparing names at call sites: no module
outside ``backends/`` compares a value with a backend's name (``backends/registry.py``), none
outside ``storage/`` with a storage format's name (``storage/registry.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

import tomllib
from hallulog.backends.registry import BACKENDS
from hallulog.storage.registry import FORMATS

REPO = Path(__file__).resolve().parents[1]
_FOLDERS = {
    *tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ].values(),
    "hallulog",
    "hallulog_vllm",
}
PRODUCT = sorted(p for folder in _FOLDERS for p in (REPO / folder).rglob("*.py"))
NAMES = {"backends": frozenset(BACKENDS), "storage": frozenset(FORMATS)}


def _compared_names(tree: ast.AST, names: frozenset[str]) -> list[tuple[int, str]]:
    """``(line, name)`` of each comparison (``==``, ``!=``, ``in``, ``not in``) with one of
    ``names`` spelled as a string, alone or in a literal tuple, list or set."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for side in (node.left, *node.comparators):
            items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            found += [
                (node.lineno, item.value)
                for item in items
                if isinstance(item, ast.Constant) and item.value in names
            ]
    return found


def test_no_call_site_compares_a_backend_or_format_name():
    bad = sorted(
        f"{path.relative_to(REPO)}:{line}: {name!r} ({room})"
        for path in PRODUCT
        for room, names in NAMES.items()
        if path.relative_to(REPO).parts[0] != room
        for line, name in _compared_names(ast.parse(path.read_text(encoding="utf-8")), names)
    )
    assert bad == []


def test_the_scan_finds_a_comparison():
    tree = ast.parse('if config.backend == "vllm" or fmt in ("npy", "x"): pass')
    assert _compared_names(tree, NAMES["backends"] | NAMES["storage"]) == [(1, "vllm"), (1, "npy")]

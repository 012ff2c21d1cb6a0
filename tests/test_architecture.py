"""The package boundaries of docs/architecture.md, checked on the source: no import cycle between
modules or packages, ``contracts/`` imports nothing of the rest and ``storage/`` only
``contracts/``, every path and module the architecture doc names exists, no artifact file name
is spelled outside ``contracts/`` and no JSONL is parsed outside ``contracts/jsonl.py``."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = (
    "contracts",
    "orchestrator",
    "workers",
    "evaluation",
    "storage",
    "serving",
    "api",
    "hallulog_vllm",
    "hallulog",
)
ALLOWED = {  # package → the project packages it may import
    "contracts": set(),
    "storage": {"contracts"},
    "workers": {"contracts", "storage"},
    "serving": {"contracts"},
    "api": {"contracts"},
    "hallulog_vllm": set(),
    "evaluation": {"contracts", "storage"},
    "orchestrator": {"contracts", "workers", "storage", "api", "evaluation"},
    "hallulog": {"contracts", "storage", "evaluation"},
}


def _modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The project module an imported dotted name refers to (longest known prefix)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in MODULES:
            return candidate
    return None


def _imports(module: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [
                f"{base}.{a.name}" if _resolve(f"{base}.{a.name}") not in (None, base) else base
                for a in node.names
            ]
        else:
            continue
        for name in names:
            target = _resolve(name)
            if target is not None and target != module:
                out.add(target)
    return out


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                found.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _collapse(unit_of) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for src, targets in GRAPH.items():
        for dst in targets:
            a, b = unit_of(src), unit_of(dst)
            if a != b:
                graph[a].add(b)
    return graph


def _subpackage(module: str) -> str:
    """``orchestrator.run.pool`` → ``orchestrator.run``; top-level modules stay themselves."""
    parts = module.split(".")
    if len(parts) >= 2 and (REPO / parts[0] / parts[1]).is_dir():
        return ".".join(parts[:2])
    return module


def test_the_walk_sees_the_project():
    assert len(MODULES) > 60
    assert "contracts.layout" in GRAPH["orchestrator.run.loop"]


def test_no_cycle_between_modules():
    assert _cycles(GRAPH) == []


def test_no_cycle_between_subpackages():
    assert _cycles(_collapse(_subpackage)) == []


def test_no_cycle_between_packages():
    assert _cycles(_collapse(lambda m: m.split(".")[0])) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_package_imports_only_what_it_may(package):
    bad = sorted(
        f"{src} imports {dst}"
        for src, targets in GRAPH.items()
        if src.split(".")[0] == package
        for dst in targets
        if dst.split(".")[0] not in ALLOWED[package] | {package}
    )
    assert bad == []


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_is_too_long():
    """Small modules, one concern each (STYLE.md): none past ~400 lines of code."""
    long = sorted(
        f"{m} ({n} lines)"
        for m, p in MODULES.items()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 450
    )
    assert long == []


_PATH_RE = re.compile(
    r"`((?:contracts|orchestrator|workers|evaluation|storage|serving|api|hallulog_vllm|hallulog|"
    r"deploy|bench|docs|scripts|tests)/[\w./-]*)`"
)


def test_architecture_doc_names_only_what_exists():
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(_PATH_RE.findall(doc))
    assert len(named) > 20
    missing = sorted(
        p
        for p in named
        if not (REPO / p.rstrip("/")).exists() and not (REPO / (p.rstrip("/") + ".py")).exists()
    )
    assert missing == []


# ---- docs/architecture.md, "Reading and writing files" -------------------------------------------


def _scanned() -> dict[str, ast.Module]:
    """Every project module outside ``contracts/``, parsed."""
    return {
        m: ast.parse(p.read_text(encoding="utf-8"))
        for m, p in MODULES.items()
        if m.split(".")[0] != "contracts"
    }


SCANNED = _scanned()


def _artifact_names() -> frozenset[str]:
    from contracts import layout

    return layout.ARTIFACT_FILE_NAMES


def _names_artifact(text: str, names: frozenset[str]) -> str | None:
    """The artifact file name ``text`` spells (the name alone, a path ending in it, or it with
    a suffix such as ``.partial``), else None."""
    for name in names:
        if text == name or text.endswith("/" + name) or text.startswith(name + "."):
            return name
    return None


def test_the_artifact_layout_names_every_file():
    names = _artifact_names()
    assert {
        "run_manifest.json",
        "generations.jsonl",
        "activation_index.jsonl",
        "completed_prompts.json",
        "logprob_inputs.jsonl",
        "report.md",
    } <= names


def test_no_artifact_path_literal_outside_contracts():
    """Every path under an artifact root comes from contracts/layout.py: no module elsewhere
    spells an artifact file's name (docstrings and messages may name one in a sentence)."""
    names = _artifact_names()
    found = sorted(
        f"{MODULES[m].relative_to(REPO)}:{node.lineno}: {node.value!r}"
        for m, tree in SCANNED.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and _names_artifact(node.value, names)
    )
    assert found == []


JSONL_PARSING_ALLOWED = {
    # the user's task files (inputs, not artifacts): BOM, per-line UTF-8 errors and malformed
    # records collected and skipped by MalformedCollector, JSON values other than objects
    "orchestrator/tasks/base.py",
    # samples the last bytes of a pilot run's files (``estimate``): starts mid-file, which the
    # committed-tail reader of contracts/jsonl.py never does
    "orchestrator/measure.py",
    # consolidation's first pass: the ids of a worker row are read from its bytes (regex on the
    # compact line contracts/jsonl.py wrote), parsed only when that fails; stops at a torn tail
    "orchestrator/postrun/commits.py",
    # parses the lines of a row group it holds in memory (the fallback when Arrow refuses
    # one), not a file
    "orchestrator/postrun/parquet.py",
}
_PARSERS = {("json", "loads"), ("orjson", "loads"), (None, "parse_line"), ("jsonl", "parse_line")}


def _parser(call: ast.Call) -> bool:
    f = call.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        return (f.value.id, f.attr) in _PARSERS
    return isinstance(f, ast.Name) and (None, f.id) in _PARSERS


def _loop_parses_its_lines(loop: ast.AST) -> bool:
    """A ``for`` loop (or comprehension) whose body parses its own loop variable as JSON."""
    if isinstance(loop, ast.For):
        targets, body = loop.target, loop.body
    else:  # a comprehension
        targets, body = loop.generators[0].target, [loop]
    names = {n.id for n in ast.walk(targets) if isinstance(n, ast.Name)}
    for stmt in body:
        for node in ast.walk(stmt):
            if (
                isinstance(node, ast.Call)
                and _parser(node)
                and node.args
                and any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node.args[0]))
            ):
                return True
    return False


def test_no_jsonl_parsing_outside_contracts_jsonl():
    """Every JSONL file is read through contracts/jsonl.py (the committed-tail rule, errors
    naming file and line): no loop elsewhere parses lines with json/orjson."""
    loops = (ast.For, ast.ListComp, ast.GeneratorExp, ast.SetComp, ast.DictComp)
    found = sorted(
        f"{rel}:{node.lineno}"
        for m, tree in SCANNED.items()
        if (rel := str(MODULES[m].relative_to(REPO))) not in JSONL_PARSING_ALLOWED
        for node in ast.walk(tree)
        if isinstance(node, loops) and _loop_parses_its_lines(node)
    )
    assert found == []


def test_the_jsonl_scan_finds_a_line_loop():
    tree = ast.parse(
        "for n, raw in enumerate(f):\n    row = json.loads(raw)\n"
        "rows = [orjson.loads(x) for x in f]\n"
    )
    loops = [n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.ListComp))]
    assert [_loop_parses_its_lines(n) for n in loops] == [True, True]

"""The rooms of docs/architecture.md, checked on the source: one import namespace (every project
import is ``hallulog.*``), no import cycle between modules, sub-packages or rooms, each room
imports only the rooms below it, no room holds more than a fifth of the product code, every path
the architecture doc names exists, no artifact file name is spelled outside ``contracts/`` and
no JSONL is parsed outside ``contracts/jsonl.py``."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]
_SETUPTOOLS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
#: room → its folder: each ``hallulog.<room>`` of pyproject's package-dir mapping
ROOMS: dict[str, str] = {
    name.split(".")[1]: folder for name, folder in _SETUPTOOLS["package-dir"].items()
}
FACE = "hallulog"  # the public face (hallulog/): what user code imports
PLUGIN = "hallulog_vllm"  # loaded by vLLM; imports nothing of hallulog
# room → the rooms it may import, lowest first: each imports only rooms listed before it
ALLOWED: dict[str, set[str]] = {
    "contracts": set(),
    "storage": {"contracts"},
    "remote": {"contracts", "storage"},
    "workers": {"contracts", "storage", "remote"},
    "serving": {"contracts"},
    "api": {"contracts"},
    "evaluation": {"contracts", "storage"},
    "exports": {"contracts", "storage"},
    # studies and compare: reads run roots' evaluations and stores, runs nothing
    "study": {"contracts", "storage", "evaluation"},
    "tasks": {"contracts", "workers"},
    "backends": {"contracts"},
    "config": {"contracts", "storage", "remote", "tasks", "backends"},
    "estimate": {"contracts", "storage", "tasks", "config", "backends"},
    "postrun": {"contracts", "storage", "exports", "tasks", "config"},
    "orchestrator": {
        "contracts",
        "storage",
        "remote",
        "workers",
        "api",
        "evaluation",
        "tasks",
        "config",
        "backends",
        "estimate",
        "postrun",
    },
    # the results explorer: reads a finished run's tables (contracts, storage), scores with the
    # evaluation's own metric code, serves under the status API's token rules (api)
    "view": {"contracts", "storage", "evaluation", "api"},
    "cli": set(ROOMS) - {"cli"},
    FACE: {"contracts", "storage", "exports", "evaluation", "cli"},
    PLUGIN: set(),
}
#: the entry modules, which only start the CLI (``python -m orchestrator``, ``python -m hallulog``)
ENTRY_MODULES = {"hallulog.orchestrator.__main__", "hallulog.__main__"}


def _modules() -> dict[str, Path]:
    """``hallulog.<room>.<module>`` (and the face's, the plugin's) → its file."""
    found = {}
    roots = {f"hallulog.{room}": REPO / folder for room, folder in ROOMS.items()}
    roots[FACE] = REPO / "hallulog"
    roots[PLUGIN] = REPO / "hallulog_vllm"
    for prefix, folder in roots.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([prefix, *parts])] = path
    return found


MODULES = _modules()


def _room(module: str) -> str:
    parts = module.split(".")
    if parts[0] == PLUGIN:
        return PLUGIN
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS else FACE


def _resolve(name: str) -> str | None:
    """The project module an imported dotted name refers to (longest known prefix)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in MODULES:
            return candidate
    return None


def _import_names(module: str, path: Path) -> list[tuple[int, str]]:
    """``(line, absolute dotted name)`` of every import in the module (lazy ones too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out += [
                (node.lineno, f"{base}.{a.name}" if _resolve(f"{base}.{a.name}") else base)
                for a in node.names
            ]
    return out


def _imports(module: str, path: Path) -> set[str]:
    out = set()
    for _line, name in _import_names(module, path):
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
        if src in ENTRY_MODULES:
            continue
        for dst in targets:
            a, b = unit_of(src), unit_of(dst)
            if a != b:
                graph[a].add(b)
    return graph


def _subpackage(module: str) -> str:
    """``hallulog.orchestrator.run.pool`` → ``hallulog.orchestrator.run``: a room's sub-package
    with everything in it; a room's own modules stay themselves."""
    parts = module.split(".")
    if len(parts) >= 3 and _room(module) in ROOMS:
        folder = REPO / ROOMS[parts[1]] / parts[2]
        if folder.is_dir():
            return ".".join(parts[:3])
    return module


def test_the_walk_sees_the_project():
    assert len(MODULES) > 150
    assert "hallulog.contracts.layout" in GRAPH["hallulog.orchestrator.run.loop"]
    assert set(ALLOWED) == set(ROOMS) | {FACE, PLUGIN}


def test_every_project_import_is_in_the_namespace():
    """No module imports a repository folder by its own name (``import storage``): installed,
    only ``hallulog.*`` exists, and from a checkout the bare name would load a second copy."""
    folders = set(ROOMS.values()) | {"bench", "tests"}
    bad = sorted(
        f"{MODULES[m].relative_to(REPO)}:{line}: {name}"
        for m, p in MODULES.items()
        for line, name in _import_names(m, p)
        if name.split(".")[0] in folders
    )
    assert bad == []


def test_the_plugin_imports_nothing_of_hallulog():
    bad = sorted(
        f"{m} imports {name}"
        for m, p in MODULES.items()
        if _room(m) == PLUGIN
        for _line, name in _import_names(m, p)
        if name.split(".")[0] == "hallulog"
    )
    assert bad == []


def test_no_cycle_between_modules():
    assert _cycles(GRAPH) == []


def test_no_cycle_between_subpackages():
    assert _cycles(_collapse(_subpackage)) == []


def test_no_cycle_between_rooms():
    assert _cycles(_collapse(_room)) == []


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_room_imports_only_the_rooms_below(room):
    bad = sorted(
        f"{src} imports {dst}"
        for src, targets in GRAPH.items()
        if _room(src) == room and src not in ENTRY_MODULES
        for dst in targets
        if _room(dst) not in ALLOWED[room] | {room}
    )
    assert bad == []


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_is_too_long():
    """Small modules, one concern each (docs/architecture.md): none past ~400 lines of code."""
    long = sorted(f"{m} ({n} lines)" for m, p in MODULES.items() if (n := _lines(p)) > 450)
    assert long == []


def test_no_room_holds_more_than_a_fifth_of_the_code():
    per_room: dict[str, int] = defaultdict(int)
    for m, p in MODULES.items():
        per_room[_room(m)] += _lines(p)
    total = sum(per_room.values())
    big = {room: round(n / total, 3) for room, n in per_room.items() if n > 0.2 * total}
    assert big == {}


_PATH_RE = re.compile(
    r"`((?:"
    + "|".join(sorted(set(ROOMS.values())))
    + r"|hallulog_vllm|hallulog|deploy|bench|docs|scripts|tests)/[\w./-]*)`"
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
        if _room(m) != "contracts"
    }


SCANNED = _scanned()


def _artifact_names() -> frozenset[str]:
    from hallulog.contracts import layout

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
    "tasks/base.py",
    # samples the last bytes of a pilot run's files (``estimate``): starts mid-file, which the
    # committed-tail reader of contracts/jsonl.py never does
    "estimate/measure.py",
    # consolidation's first pass: the ids of a worker row are read from its bytes (regex on the
    # compact line contracts/jsonl.py wrote), parsed only when that fails; stops at a torn tail
    "postrun/commits.py",
    # parses the lines of a row group it holds in memory (the fallback when Arrow refuses
    # one), not a file
    "postrun/parquet.py",
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


def _rooms_table() -> dict[str, set[str]]:
    """Room → the rooms its row in docs/architecture.md ("Rooms") says it imports."""
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = doc.split("\n## Rooms\n", 1)[1].split("\n## ", 1)[0]
    by_folder = {folder: room for room, folder in ROOMS.items()} | {FACE: FACE, PLUGIN: PLUGIN}
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`(\w+)/`", cells[0])
        if len(cells) != 3 or match is None:
            continue
        room, imports = by_folder.get(match.group(1), match.group(1)), cells[2]
        if imports == "every other room":
            rows[room] = set(ROOMS) - {room}
        else:
            rows[room] = set() if imports == "none" else {x.strip() for x in imports.split(",")}
    return rows


def test_the_rooms_table_is_the_rule():
    """docs/architecture.md's rooms table says what ALLOWED enforces, room by room."""
    assert _rooms_table() == ALLOWED

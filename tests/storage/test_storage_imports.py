"""storage/ imports nothing of the rest of hallulog but contracts/, and its modules (sub-packages
included) import each other without a cycle."""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STORAGE = os.path.join(ROOT, "storage")
OTHER_PACKAGES = {
    "orchestrator",
    "workers",
    "serving",
    "api",
    "evaluation",
    "hallulog",
    "hallulog_vllm",
    "bench",
    "deploy",
}


def _modules() -> dict[str, str]:
    """``module -> path`` of every storage module; a sub-package's as ``sub.module`` (its
    ``__init__`` as ``sub``)."""
    out = {}
    for dirpath, _dirs, files in os.walk(STORAGE):
        sub = os.path.relpath(dirpath, STORAGE)
        for name in sorted(files):
            if not name.endswith(".py") or (
                sub != "." and not os.path.exists(os.path.join(dirpath, "__init__.py"))
            ):
                continue
            parts = ([] if sub == "." else sub.split(os.sep)) + [name[:-3]]
            if parts[-1] == "__init__" and len(parts) > 1:
                parts.pop()
            out[".".join(parts)] = os.path.join(dirpath, name)
    return out


def imports() -> dict[str, set[str]]:
    """``module -> storage modules it imports`` (at any depth: lazy imports count too)."""
    modules = _modules()
    graph = {}
    for mod, path in modules.items():
        tree = ast.parse(open(path).read(), path)
        is_package = path.endswith("__init__.py") and mod != "__init__"
        here = mod.split(".") if is_package else mod.split(".")[:-1]  # the importing package
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[: len(here) - node.level + 1]
                    names = (
                        [".".join(base + node.module.split("."))]
                        if node.module
                        else [".".join(base + [a.name]) for a in node.names]
                    )
                    for name in names:  # the longest storage module the name starts with
                        parts = name.split(".")
                        while parts and ".".join(parts) not in modules:
                            parts.pop()
                        if parts:
                            deps.add(".".join(parts))
                elif node.module and node.module.startswith("storage."):
                    deps.add(node.module.split(".")[1])
                elif node.module:
                    assert node.module.split(".")[0] not in OTHER_PACKAGES, (path, node.module)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    assert a.name.split(".")[0] not in OTHER_PACKAGES, (path, a.name)
        graph[mod] = deps - {mod}
    return graph


def test_no_import_cycle_and_nothing_outside_storage():
    graph = imports()
    package_init = graph.pop("__init__")  # the package re-exports; no module imports it
    assert all("__init__" not in d for d in graph.values())
    assert package_init <= set(graph)
    state: dict[str, int] = {}

    def visit(m, path):
        if state.get(m) == 1:
            raise AssertionError("import cycle: " + " -> ".join(path + [m]))
        if state.get(m) == 2:
            return
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            visit(d, path + [m])
        state[m] = 2

    for m in graph:
        visit(m, [])

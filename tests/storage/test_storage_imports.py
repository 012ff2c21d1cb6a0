"""storage/ imports nothing from the rest of hallulog, and its modules import each other without a cycle."""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STORAGE = os.path.join(ROOT, "storage")
OTHER_PACKAGES = {"orchestrator", "workers", "serving", "api", "hallulog_vllm", "bench", "deploy"}


def imports() -> dict[str, set[str]]:
    """``module -> storage modules it imports`` (at any depth: lazy imports count too)."""
    graph = {}
    for name in sorted(os.listdir(STORAGE)):
        if not name.endswith(".py"):
            continue
        mod = name[:-3]
        tree = ast.parse(open(os.path.join(STORAGE, name)).read(), name)
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1 and node.module:
                    deps.add(node.module.split(".")[0])
                elif node.level == 1:
                    deps.update(a.name for a in node.names)
                elif node.level == 0 and node.module and node.module.startswith("storage."):
                    deps.add(node.module.split(".")[1])
                elif node.level == 0 and node.module:
                    assert node.module.split(".")[0] not in OTHER_PACKAGES, (name, node.module)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    assert a.name.split(".")[0] not in OTHER_PACKAGES, (name, a.name)
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

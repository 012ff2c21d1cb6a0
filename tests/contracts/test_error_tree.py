"""One error tree (docs/architecture.md, "Errors"): every exception class defined in the product
rooms derives from ``hallulog.contracts.errors.HallulogError``, so the CLI prints it as one line
and a caller can catch hallulog's errors as one family; an error that is a case of a builtin
subclasses that builtin too. Read from the source (no import of the rooms: the walk stays fast)."""

from __future__ import annotations

import ast
import builtins
import importlib
import re

import pytest

from tests.test_architecture import FACE, MODULES, _room

ROOT = ("hallulog.contracts.errors", "HallulogError")
#: a base from another package is imported (to see whether it is an exception) only when its
#: name says it may be one: the walk never imports torch or fastapi
_EXCEPTION_NAME = re.compile(r"(Error|Exception|Exit|Interrupt|Warning|Timeout|Cancelled)$")
#: exceptions outside the tree on purpose, each with its reason
DELIBERATE = {
    # SIGTERM as Ctrl-C: a KeyboardInterrupt, so no ``except Exception`` stops the shutdown
    "hallulog.orchestrator.run.loop._Stop": "a KeyboardInterrupt (SIGTERM handled as Ctrl-C)",
    # --max-storage-gb stops the run through the same path as Ctrl-C, committed work kept
    "hallulog.orchestrator.run.budget.StorageCapReached": "a KeyboardInterrupt (the storage cap)",
    # the fault injector's crash must escape every handler, as a SIGKILL would
    "hallulog.workers._faults.SimulatedCrash": "a BaseException (fault injection in tests)",
    # raised inside Jinja's rendering, where Jinja expects its own type; render() turns it into
    # PromptFieldError before it leaves tasks/prompting.py
    "hallulog.tasks.prompting._FieldError": "Jinja's UndefinedError, never leaves render()",
}


def _imports(tree: ast.Module, module: str, is_package: bool) -> dict[str, str]:
    """Local name → dotted name it was imported as."""
    package = module if is_package else module.rpartition(".")[0]
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[(a.asname or a.name).split(".")[0]] = (
                    a.name if a.asname else a.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                names[a.asname or a.name] = f"{base}.{a.name}"
    return names


def _dotted(expr: ast.expr) -> str | None:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute) and (head := _dotted(expr.value)):
        return f"{head}.{expr.attr}"
    return None


def _index(modules: dict[str, str]) -> tuple[dict, dict]:
    """(module, class) → its base expressions; module → its import names. ``modules``: name →
    source (``__init__`` modules end in ``.__init__``)."""
    classes, imports = {}, {}
    for name, source in modules.items():
        is_package = name.endswith(".__init__")
        module = name.removesuffix(".__init__")
        tree = ast.parse(source)
        imports[module] = _imports(tree, module, is_package)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes[(module, node.name)] = [_dotted(b) for b in node.bases]
    return classes, imports


def _resolve(dotted: str | None, module: str, classes: dict, imports: dict):
    """A base expression → ("project", (module, class)) | ("builtin"/"external", class) | None."""
    if dotted is None:
        return None
    head, _, rest = dotted.partition(".")
    if not rest and (module, head) in classes:
        return "project", (module, head)
    full = imports[module].get(head)
    if full is None:
        obj = getattr(builtins, dotted, None)
        return ("builtin", obj) if isinstance(obj, type) else None
    owner, _, attr = (f"{full}.{rest}" if rest else full).rpartition(".")
    if owner in imports:  # a project module: its class, or a name it re-exports
        if (owner, attr) in classes:
            return "project", (owner, attr)
        return _resolve(attr, owner, classes, imports) if attr in imports[owner] else None
    if owner.split(".")[0] in {"hallulog", "hallulog_vllm"}:
        return None
    if not _EXCEPTION_NAME.search(attr):  # torch.nn.Module, threading.Thread: not imported
        return "external", object
    try:
        obj = getattr(importlib.import_module(owner), attr)
    except (ImportError, AttributeError):
        return None
    return ("external", obj) if isinstance(obj, type) else None


def _family(key, classes, imports, seen=None) -> tuple[bool, bool, list[str]]:
    """(is an exception, derives from HallulogError, bases it could not resolve)."""
    seen = seen if seen is not None else set()
    if key == ROOT:
        return True, True, []
    if key in seen:
        return False, False, []
    seen.add(key)
    exc = tree = False
    unresolved = []
    for dotted in classes[key]:
        found = _resolve(dotted, key[0], classes, imports)
        if found is None:
            if dotted not in {"Protocol", "TypedDict", "Generic", "object", "NamedTuple"}:
                unresolved.append(f"{key[0]}.{key[1]}: base {dotted}")
            continue
        kind, target = found
        if kind == "project":
            e, t, u = _family(target, classes, imports, seen)
            exc, tree, unresolved = exc or e, tree or t, unresolved + u
        else:
            exc = exc or issubclass(target, BaseException)
    return exc, tree, unresolved


def _check(modules: dict[str, str]) -> tuple[list[str], list[str], int]:
    """(exceptions outside the tree, bases not resolved, exceptions found)."""
    classes, imports = _index(modules)
    outside, unresolved, count = [], [], 0
    for key in sorted(classes):
        exc, tree, u = _family(key, classes, imports)
        if exc:
            count += 1
            if not tree:
                outside.append(f"{key[0]}.{key[1]}")
        unresolved += [x for x in u if exc or "Error" in x]
    return outside, sorted(set(unresolved)), count


def _product_sources() -> dict[str, str]:
    out = {}
    for module, path in MODULES.items():
        if _room(module) == "hallulog_vllm":  # imports nothing of hallulog (vLLM loads it)
            continue
        name = f"{module}.__init__" if path.name == "__init__.py" else module
        out[name] = path.read_text(encoding="utf-8")
    return out


def test_every_exception_of_the_product_derives_from_hallulog_error():
    outside, unresolved, count = _check(_product_sources())
    assert unresolved == []
    assert count > 40  # the walk sees the tree (45 classes when this was written)
    assert sorted(set(outside) - set(DELIBERATE)) == []
    assert sorted(set(DELIBERATE) - set(outside)) == []  # the list stays current


def test_the_plugin_defines_no_exception():
    """vLLM's plugin cannot join the tree (it imports nothing of hallulog): it raises none."""
    plugin = {m: p for m, p in MODULES.items() if _room(m) == "hallulog_vllm"}
    assert plugin and FACE == "hallulog"
    found = [
        f"{m}.{node.name}"
        for m, p in plugin.items()
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef)
        and any((_dotted(b) or "").endswith(("Error", "Exception")) for b in node.bases)
    ]
    assert found == []


@pytest.mark.parametrize(
    ("source", "outside"),
    [
        ("class Lost(RuntimeError):\n    pass\n", ["hallulog.x.mod.Lost"]),
        (
            "from hallulog.contracts.errors import HallulogError\n"
            "class Kept(HallulogError, OSError):\n    pass\n"
            "class Child(Kept):\n    pass\n",
            [],
        ),
        ("import jinja2\nclass J(jinja2.UndefinedError):\n    pass\n", ["hallulog.x.mod.J"]),
        ("class Plain:\n    pass\n", []),
    ],
)
def test_the_walk_tells_a_stray_exception(source, outside):
    modules = {
        "hallulog.contracts.errors": "class HallulogError(Exception):\n    pass\n",
        "hallulog.x.mod": source,
    }
    assert _check(modules)[0] == outside

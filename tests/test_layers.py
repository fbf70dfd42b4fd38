"""The package's layers import downward only and no module imports itself through others.

docs/architecture.md draws the layers; this test reads every ``import`` in ``mlbench/`` (at
module level and inside functions, where the lazy imports are) and fails on an import circle or on
a module that imports from a layer above its own. A lazy import inside a function is still a
dependency: it only moves the failure from start-up to the first call.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mlbench"

#: Lowest first. A module may import its own layer's packages and any lower layer's.
LAYERS: list[set[str]] = [
    {"errors", "extras", "frameworks", "timing", "progress", "jsonfile", "safefile", "plugins", "version",
     "checkpoint_schedule"},
    {"tasks", "network"},
    {"optim"},
    {"run_config"},
    {"results"},
    {"worker", "checks"},
    {"cloud", "launch"},
    {"api"},
    {"server", "dashboard"},
    {"cli", "__main__"},
    {"mlbench"},   # the package's front door (mlbench/__init__.py): exports the API
]


def module_names() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def import_graph() -> dict[str, set[str]]:
    """Module -> the mlbench modules it imports (a package's ``__init__`` only when a name is
    taken from it, not when a submodule is)."""
    modules = module_names()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                submodules = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
                targets = submodules + ([base] if len(submodules) < len(node.names) else [])
            else:
                continue
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def layer_of(module: str) -> int:
    parts = module.split(".")
    key = parts[1] if len(parts) > 1 else parts[0]
    for level, names in enumerate(LAYERS):
        if key in names:
            return level
    raise AssertionError(f"{module} belongs to no layer: add its package to LAYERS (and to docs/architecture.md)")


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_module_imports_itself_through_others():
    assert import_circles(import_graph()) == []


def test_every_import_goes_to_the_same_layer_or_below():
    upward = [f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})"
              for a, targets in import_graph().items() for b in sorted(targets) if layer_of(b) > layer_of(a)]
    assert upward == []


def test_the_circle_finder_finds_a_circle():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]

"""The optimizer layer knows no task: no module under mlbench/optim/ imports mlbench.tasks.

An optimizer gets the task's hyper-parameters as numbers (:class:`mlbench.optim.hyper.Hyper`,
built by the worker from the task) and its rate per step through ``step(lr)``; the test bed of
``mlbench check-optimizer`` lives above both layers (:mod:`mlbench.checks.optimizer`). This reads
every import of every module there, the lazy ones inside functions included.
"""

from __future__ import annotations

import ast
from pathlib import Path

OPTIM = Path(__file__).resolve().parents[2] / "mlbench" / "optim"


def imported_modules(source: str) -> set[str]:
    """The absolute names of the modules ``source`` imports (relative imports of the optim package resolved)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = ["mlbench", "optim"][:3 - node.level]
                base = ".".join(parent + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def task_imports(source: str) -> list[str]:
    return sorted(n for n in imported_modules(source) if n == "mlbench.tasks" or n.startswith("mlbench.tasks."))


def test_no_optimizer_module_imports_a_task_module():
    found = {path.name: task_imports(path.read_text(encoding="utf-8")) for path in sorted(OPTIM.rglob("*.py"))}
    assert {name: mods for name, mods in found.items() if mods} == {}


def test_the_import_reader_sees_lazy_and_package_imports():
    source = ("import mlbench.tasks\n"
              "def f():\n    from mlbench.tasks.task1a import TASK1A\n"
              "def g():\n    from mlbench import tasks\n"
              "from mlbench.optim.base import set_lr\n")
    assert task_imports(source) == ["mlbench.tasks", "mlbench.tasks.task1a", "mlbench.tasks.task1a.TASK1A"]
    assert "mlbench.tasks" in imported_modules("from mlbench import tasks")

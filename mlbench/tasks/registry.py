"""The one registry of tasks: each task is a package under ``mlbench/tasks/`` that declares itself.

A task package's ``__init__`` (torch-free) defines ``SPEC``, its :class:`~mlbench.tasks.spec.TaskSpec`
or :class:`~mlbench.tasks.spec.AllreduceSpec`, and ``RUNTIME_MODULE``, the module the workers import
to run it: ``build_runtime(config, rank, device, timer)`` for a training task (a
:class:`~mlbench.tasks.runtime.TaskRuntime`), ``run_benchmark(config, rank, events)`` for a
measurement (task 0a); optionally ``prepare_before_fork(config)``, which the local supervisor calls
once before it forks the ranks from itself (what every rank would otherwise make alike, such as
synthetic data or the modules a model's FLOP count imports; it must not compute with torch, whose
thread pool a forked child cannot use, nor start a thread).
The packages are imported on first use, the runtime modules (torch, the models and the data
code) only by the workers. A new task is one package plus its name in
:data:`TASK_PACKAGES`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from types import ModuleType

from mlbench.errors import UsageError
from mlbench.tasks.spec import AnySpec, TaskSpec

#: The task packages, in the order ``mlbench tasks`` lists them (the one list of tasks).
TASK_PACKAGES: tuple[str, ...] = ("task0a", "task1a", "task2a", "task3a", "task4b", "task5a")


class _Tasks(Mapping[str, AnySpec]):
    """Task name -> spec, filled by importing the task packages on first access."""

    def __init__(self) -> None:
        self._specs: dict[str, AnySpec] = {}
        self._runtimes: dict[str, str] = {}

    def _load(self) -> dict[str, AnySpec]:
        if not self._specs:
            for package in TASK_PACKAGES:
                module = importlib.import_module(f"mlbench.tasks.{package}")
                spec: AnySpec = module.SPEC
                self._specs[spec.name] = spec
                self._runtimes[spec.name] = module.RUNTIME_MODULE
        return self._specs

    def __getitem__(self, name: str) -> AnySpec:
        return self._load()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())

    def runtime_module(self, name: str) -> str:
        self._load()
        return self._runtimes[name]


#: Every task by name (the closed-division specs, before any override).
TASKS = _Tasks()


def get_task(name: str) -> AnySpec:
    """The spec of task ``name``; a usage error naming the tasks if there is none."""
    try:
        return TASKS[name]
    except KeyError:
        raise UsageError(f"unknown task {name!r}; choose one of: {', '.join(TASKS)} "
                         "(see `mlbench tasks`)", option="task") from None


def reference_optimizers() -> dict[str, str]:
    """Each training task's reference optimizer (its closed division's), by task: what
    ``mlbench optimizers`` and the dashboard's form say of each optimizer."""
    return {name: spec.optimizer for name, spec in TASKS.items() if isinstance(spec, TaskSpec)}


def runtime_module(spec: AnySpec) -> ModuleType:
    """The worker-side module of a task (imports torch and the task's model and data code)."""
    return importlib.import_module(TASKS.runtime_module(spec.name))

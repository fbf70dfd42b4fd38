"""Task runtimes by name: ``TaskSpec.runtime`` names the builder that makes a task's runtime.

A builder takes the run configuration, this worker's rank, its device and the phase timer, and
returns a :class:`~mlbench.tasks.runtime.TaskRuntime`. Builders register with
:func:`register_runtime`; :func:`build_runtime` imports the modules that define them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from mlbench.run_config import RunConfig
from mlbench.tasks.runtime import TaskRuntime
from mlbench.timing import PhaseTimer

RuntimeBuilder = Callable[[RunConfig, int, torch.device, PhaseTimer], TaskRuntime]

RUNTIMES: dict[str, RuntimeBuilder] = {}

#: The modules whose import registers the runtimes (imported on first use: each pulls its task's
#: models and data code).
RUNTIME_MODULES = ("mlbench.worker.supervised", "mlbench.worker.language")


def register_runtime(name: str) -> Callable[[RuntimeBuilder], RuntimeBuilder]:
    def decorate(builder: RuntimeBuilder) -> RuntimeBuilder:
        RUNTIMES[name] = builder
        return builder
    return decorate


def build_runtime(config: RunConfig, rank: int, device: torch.device, timer: PhaseTimer) -> TaskRuntime:
    for module in RUNTIME_MODULES:
        importlib.import_module(module)
    spec = config.training_spec
    try:
        builder = RUNTIMES[spec.runtime]
    except KeyError:
        raise ValueError(f"task {spec.name} names the runtime {spec.runtime!r}, "
                         f"which is not registered ({', '.join(RUNTIMES)})") from None
    return builder(config, rank, device, timer)

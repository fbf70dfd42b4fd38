"""The frameworks a run may train with (``mlbench run --framework``), and what each can run.

The PyTorch worker (``python -m mlbench.worker``) runs every task; a port to another framework
keeps the same worker contract (docs/worker-contract.md) in a program of its own, started as a
fresh interpreter, and runs the tasks it has a port of. Torch-free and import-free: the CLI checks
a request here before anything is recorded, without importing the framework itself.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from mlbench.errors import UsageError
from mlbench.extras import MissingExtra, install_hint


@dataclass(frozen=True)
class Framework:
    """``worker``: the module run as ``python -m WORKER RUN_DIR --rank R``; ``modules``: what
    must be importable; ``extra``: the pip extra that installs them (None: the core); ``tasks``:
    the tasks it has a port of (None: all); ``package``: the key under which a worker's
    ``environment`` event records the framework's version; ``peers``: every worker listens on
    an address of its own (TensorFlow's gRPC servers), which the supervisor picks and passes to
    all of them, instead of one rendezvous at rank 0; ``listens_everywhere``: those servers bind
    every interface whatever address they are given (TensorFlow's gRPC servers bind ``0.0.0.0``),
    so the local supervisor runs the workers in a network namespace of their own
    (:class:`mlbench.network.emulation.PrivateLoopback`)."""

    name: str
    title: str
    worker: str
    package: str
    modules: tuple[str, ...] = ()
    extra: str | None = None
    tasks: tuple[str, ...] | None = None
    peers: bool = False
    listens_everywhere: bool = False

    def installed(self) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in self.modules)


PYTORCH = Framework("pytorch", "PyTorch", "mlbench.worker", "torch")
JAX = Framework("jax", "JAX", "mlbench.worker.jax_worker", "jax", modules=("jax", "optax"), extra="jax",
                tasks=("task1a", "task2a"))

TENSORFLOW = Framework("tensorflow", "TensorFlow", "mlbench.worker.tf_worker", "tensorflow",
                       modules=("tensorflow",), extra="tensorflow", tasks=("task1a", "task2a"), peers=True,
                       listens_everywhere=True)

FRAMEWORKS: dict[str, Framework] = {f.name: f for f in (PYTORCH, JAX, TENSORFLOW)}
DEFAULT_FRAMEWORK = PYTORCH.name
#: the frameworks whose workers are ports (a pip extra and an image variant of their own)
PORTS: dict[str, Framework] = {name: f for name, f in FRAMEWORKS.items() if f.extra}


def get_framework(name: str) -> Framework:
    try:
        return FRAMEWORKS[name]
    except KeyError:
        raise UsageError(f"--framework {name}: choose one of {', '.join(FRAMEWORKS)}") from None


def framework_release(name: str, environment: dict) -> str:
    """The framework and its version as a run's ``environment`` event records them (``JAX
    0.4.30``), as MLPerf's system descriptions name a submission's framework; a framework this
    version does not know (a run recorded by a newer one) by its name."""
    framework = FRAMEWORKS.get(name)
    if framework is None:
        return name
    version = environment.get(framework.package)
    return f"{framework.title} {version}" if version else framework.title


def check_framework(name: str, task: str, installed_here: bool = True) -> Framework:
    """The framework ``name`` if it has a port of ``task`` and, with ``installed_here`` (the
    workers run this Python: not a cluster's image), is installed; else one line: UsageError
    (exit 2) for a task without a port, MissingExtra (exit 1) naming the pip extra."""
    framework = get_framework(name)
    if framework.tasks is not None and task not in framework.tasks:
        raise UsageError(f"--framework {name}: {task} has no {framework.title} port "
                         f"({framework.title} runs {', '.join(framework.tasks)}); "
                         f"use --framework {DEFAULT_FRAMEWORK}")
    if installed_here and not framework.installed():
        assert framework.extra is not None
        raise MissingExtra(f"--framework {name}: {framework.title} is not installed: {install_hint(framework.extra)}")
    return framework

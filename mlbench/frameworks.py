"""The frameworks a run may train with (``mlbench run --framework``), and what each can run.

The PyTorch worker (``python -m mlbench.worker``) runs every task; a port to another framework
keeps the same worker contract (docs/worker-contract.md) in a program of its own, started as a
fresh interpreter, and runs the tasks it has a port of. Each record says which tasks and which
run features (:data:`FEATURES`) its worker offers; the planner refuses the others from it, and
docs/frameworks.md shows it (tests/frameworks/test_framework_features.py keeps the two equal).
Torch-free and import-free: the CLI checks a request here before anything is recorded, without
importing the framework itself.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from mlbench.errors import UsageError
from mlbench.extras import MissingExtra, install_hint


@dataclass(frozen=True)
class Feature:
    """Something `mlbench run` offers beyond the closed division's training on CPUs over gloo,
    which a framework's worker does or does not do (:attr:`Framework.supports`): ``name``, its
    key there; ``option``, what asks for it; ``what``, one line for docs/frameworks.md;
    ``refusal``, the line that refuses it (``{framework}``: ``--framework NAME``; ``{given}``:
    the option as the run gave it)."""

    name: str
    option: str
    what: str
    refusal: str = "{framework}: {given} is not in this port yet (it runs on CPUs, over gloo)"


#: every feature a framework may lack, in the order a run is checked against them
FEATURES: dict[str, Feature] = {f.name: f for f in (
    Feature("optimizers", "--optimizer, --opt", "an optimizer other than the task's reference, or its options",
            "{framework} trains with the task's reference optimizer only; drop --optimizer/--opt"),
    Feature("model-plugins", "--model FILE.py:NAME", "a model plug-in instead of the task's model",
            "{framework} trains the task's own model; drop the model plug-in"),
    Feature("cuda", "--device cuda", "training on GPUs"),
    Feature("time-budget", "--time-budget", "stopping after a budget of training time"),
    Feature("bf16", "--precision bf16", "bfloat16 mixed precision"),
    Feature("save-model", "--save-model", "the trained model saved with the run"),
    Feature("channels-last", "--channels-last", "the channels-last memory layout"),
    Feature("backends", "--backend nccl|mpi", "a collective backend other than gloo"),
    Feature("network", "--bandwidth, --latency, --jitter, --loss", "an emulated network"),
    Feature("faults", "--inject", "injected faults"),
    Feature("recovery", "--on-failure restart|shrink", "restarting or shrinking the workers after a failure"),
    Feature("checkpoints", "--checkpoint-every", "checkpoints, and resuming a run from them"),
)}


@dataclass(frozen=True)
class Framework:
    """``worker``: the module run as ``python -m WORKER RUN_DIR --rank R``; ``modules``: what
    must be importable; ``extra``: the pip extra that installs them (None: the core); ``tasks``:
    the tasks it has a port of (None: all); ``supports``: the :data:`FEATURES` its worker
    offers (a run that asks for another is refused before it is recorded); ``package``: the
    key under which a worker's ``environment`` event records the framework's version;
    ``peers``: every worker listens on an address of its own (TensorFlow's gRPC servers), which
    the supervisor picks and passes to all of them, instead of one rendezvous at rank 0;
    ``listens_everywhere``: those servers bind every interface whatever address they are given
    (TensorFlow's gRPC servers bind ``0.0.0.0``), so the local supervisor runs the workers in a
    network namespace of their own (:class:`mlbench.network.emulation.PrivateLoopback`);
    ``transport``: what its workers' collectives travel over whatever the run's ``--backend``
    (None: the run's backend; TensorFlow's ring all-reduce goes over gRPC, JAX's CPU
    collectives over gloo); ``model_module``: the name of a port's module in each of its tasks' packages
    (``mlbench/tasks/task1a/jax_model.py``), which builds the task's model in the framework
    (its ``make_port``): the PyTorch, JAX and TensorFlow parts of a task sit side by side."""

    name: str
    title: str
    worker: str
    package: str
    modules: tuple[str, ...] = ()
    extra: str | None = None
    tasks: tuple[str, ...] | None = None
    supports: frozenset[str] = frozenset()
    peers: bool = False
    listens_everywhere: bool = False
    model_module: str | None = None
    transport: str | None = None

    def __post_init__(self) -> None:
        unknown = self.supports - set(FEATURES)
        if unknown:
            raise ValueError(f"{self.name} supports unknown features: {', '.join(sorted(unknown))}")

    def port_module(self, task: str) -> str:
        """The module of this framework's port of ``task`` (a task it has a port of)."""
        if self.model_module is None or (self.tasks is not None and task not in self.tasks):
            raise ValueError(f"{self.title} has no port of {task}")
        return f"mlbench.tasks.{task}.{self.model_module}"

    def installed(self) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in self.modules)

    def refusal(self, feature: str, given: str) -> str:
        """The one line that refuses ``feature`` (one this framework does not support), which
        the run asked for as ``given`` (``--backend nccl``)."""
        return FEATURES[feature].refusal.format(framework=f"--framework {self.name}", given=given)


PYTORCH = Framework("pytorch", "PyTorch", "mlbench.worker", "torch", supports=frozenset(FEATURES))
JAX = Framework("jax", "JAX", "mlbench.worker.jax_worker", "jax", modules=("jax", "optax"), extra="jax",
                tasks=("task1a", "task2a"), model_module="jax_model", supports=frozenset({"save-model"}),
                transport="gloo")

TENSORFLOW = Framework("tensorflow", "TensorFlow", "mlbench.worker.tf_worker", "tensorflow",
                       modules=("tensorflow",), extra="tensorflow", tasks=("task1a", "task2a"), peers=True,
                       listens_everywhere=True, model_module="tf_model", supports=frozenset({"save-model"}),
                       transport="grpc")

FRAMEWORKS: dict[str, Framework] = {f.name: f for f in (PYTORCH, JAX, TENSORFLOW)}
DEFAULT_FRAMEWORK = PYTORCH.name
#: the frameworks whose workers are ports (a pip extra and an image variant of their own)
PORTS: dict[str, Framework] = {name: f for name, f in FRAMEWORKS.items() if f.extra}


def transport_of(framework: str, backend: str) -> str:
    """What a run's collectives travel over: its framework's own transport, else ``backend``
    (a run's header says ``cpu/grpc`` for TensorFlow, never the gloo it does not use)."""
    record = FRAMEWORKS.get(framework)
    return record.transport if record is not None and record.transport else backend


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

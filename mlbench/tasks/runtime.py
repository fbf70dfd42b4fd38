"""What the trainer asks of a task, on one worker: the contract between a task and the loop.

The worker's loop (:mod:`mlbench.worker.trainer`) is the same for every training task: epochs,
the time budget, logging, evaluation and the goal. What differs between an image classifier, a
language model and a translation model (their batches, their forward pass, their learning-rate
rule, their evaluation) is a :class:`TaskRuntime`, built by the builder that the task spec names
(its package's ``RUNTIME_MODULE``, :mod:`mlbench.tasks.registry`). A new kind of task is one new
runtime in its own package.

The runtimes sit below the run configuration and the results in the package's layers
(docs/architecture.md): they read the run through :class:`RunView` and report through
:class:`EventSink`, which :class:`mlbench.run_config.RunConfig` and
:class:`mlbench.results.events.EventWriter` are.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import torch
import torch.distributed as dist

from mlbench.tasks.spec import AnySpec, TaskSpec


class RunView(Protocol):
    """What a task's runtime reads of the run's configuration (a RunConfig)."""

    @property
    def task(self) -> AnySpec: ...

    @property
    def training_spec(self) -> TaskSpec: ...

    @property
    def workers(self) -> int: ...

    @property
    def backend(self) -> str: ...

    @property
    def device(self) -> str: ...

    @property
    def data(self) -> str: ...

    @property
    def data_dir(self) -> str | None: ...

    @property
    def seed(self) -> int: ...

    @property
    def precision(self) -> str: ...

    @property
    def channels_last(self) -> bool: ...

    @property
    def graph(self) -> bool: ...

    @property
    def eval_batch_size(self) -> int: ...


class EventSink(Protocol):
    """Where a worker's events go (an EventWriter): the all-reduce sweep records each measurement."""

    def emit(self, name: str, value: Any, *, epoch: float, step: int) -> None: ...


class StepOptimizer(Protocol):
    """The part of a distributed optimizer (mlbench.optim) that a runtime drives."""

    module: torch.nn.Module
    bytes_sent: int

    def zero_grad(self) -> None: ...

    def step(self, lr: float) -> None: ...


class TaskRuntime(Protocol):
    """One training task on one worker (rank ``rank`` of ``world``).

    ``batches(epoch)`` yields this worker's batches; every rank yields the same number, so that
    all ranks stay in lock-step. ``train_step`` runs the forward and backward passes of one
    global step (several micro-batches where the task accumulates gradients) and calls
    ``optimizer.step(lr)`` exactly once; it returns the step's loss as a device tensor, not
    synchronised. Given the same state (``state_dict``, the model's, the random generators') and
    the same batch, a step does the same thing: that is what makes a resumed run exact.
    ``evaluate`` returns the metrics of the evaluation set, already reduced over all workers:
    ``{"loss": ..., <metric name>: ...}``.
    """

    model: torch.nn.Module
    metric_name: str

    def steps_per_epoch(self) -> int: ...

    def begin_epoch(self, epoch: int) -> None: ...

    def batches(self, epoch: int) -> Iterator[Any]: ...

    def lr(self, step: int, batch: Any) -> float: ...

    def train_step(self, batch: Any, lr: float, optimizer: StepOptimizer) -> torch.Tensor: ...

    def samples_in(self, batch: Any) -> int: ...

    def evaluate(self) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]:
        """What the runtime carries between steps beyond the model (a language model's hidden
        state, averaged weights, a loss scale), for a checkpoint; tensors on any device."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``, after ``begin_epoch`` of the checkpoint's epoch."""
        ...


def all_reduce_sum(values: list[float], world: int, device: torch.device) -> list[float]:
    """Element-wise sum of ``values`` over the workers (float64; on ``device`` for the backend)."""
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if world > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.tolist()

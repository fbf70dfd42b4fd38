"""The interface between a task with its own training logic and the worker's loop.

Tasks 1a and 2a are "a model, a data set and a loss" that the trainer drives itself; the
language tasks 3a and 4b carry logic of their own (recurrent state, random sequence lengths,
averaged SGD, gradient accumulation, loss scaling, beam search). Each of them is a
:class:`TaskRuntime`: one task on one worker, which the trainer drives through the methods
below. The trainer keeps what is the same for every task (the step and epoch counters, the
goal, the time budget, the timing of phases, the metric events).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import torch
import torch.distributed as dist


class TaskRuntime(Protocol):
    model: torch.nn.Module
    metric_name: str            # "perplexity" | "bleu"
    higher_is_better: bool

    def steps_per_epoch(self) -> int:
        """Global steps of the epoch begun last (epoch 0 before any); the same on every rank."""

    def begin_epoch(self, epoch: int) -> None:
        """Reset what an epoch starts with (recurrent state, the epoch's batch order)."""

    def batches(self, epoch: int) -> Iterator[Any]:
        """This worker's batch of every global step of ``epoch``, as many on every rank."""

    def lr(self, step: int, batch: Any) -> float:
        """The learning rate of global step ``step`` (0-based), which uses ``batch``."""

    def train_step(self, batch: Any, lr: float, optimizer: Any) -> torch.Tensor:
        """Forward and backward (all micro-batches), then exactly one ``optimizer.step(lr)``;
        the detached training loss of this worker's share, for logging."""

    def samples_in(self, batch: Any) -> int:
        """What this worker processed in ``batch`` for throughput (sequences or tokens)."""

    def evaluate(self) -> dict[str, float]:
        """``{"loss": ..., metric_name: ...}`` on the evaluation set, all-reduced over workers."""


def all_reduce_sum(values: list[float], world: int, device: torch.device) -> list[float]:
    """Element-wise sum of ``values`` over the workers (float64; on ``device`` for the backend)."""
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if world > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.tolist()

"""The interface every distributed optimizer implements, and the registry that names them.

A distributed optimizer owns both halves of an update after the backward pass: the
communication (which it times as the "communication" phase and counts in bytes sent) and the
local update (the "optimizer" phase). The worker calls :meth:`DistributedOptimizer.step` once per
minibatch with the learning rate of that step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from mlbench.errors import UsageError
from mlbench.tasks.spec import TaskSpec
from mlbench.worker.timing import PhaseTimer


@dataclass
class OptimizerContext:
    """What an optimizer may use: the model, the task's hyper-parameters, the process group."""

    model: torch.nn.Module
    spec: TaskSpec
    world_size: int
    rank: int
    timer: PhaseTimer
    options: dict[str, str] = field(default_factory=dict)
    group: Any = None  # torch.distributed ProcessGroup; None = the default group


class DistributedOptimizer:
    """Base class: subclasses implement :meth:`step`; ``bytes_sent`` counts what this rank sent."""

    name = ""
    reference = ""
    closed_division = False
    options_help: dict[str, str] = {}

    def __init__(self, ctx: OptimizerContext):
        self.ctx = ctx
        self.params = [p for p in ctx.model.parameters() if p.requires_grad]
        self.bytes_sent = 0

    def step(self, lr: float) -> None:
        raise NotImplementedError

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def state_for_eval(self) -> None:
        """Make every rank's model ready for evaluation (decentralized methods override)."""


def local_sgd(ctx: OptimizerContext, params: list[torch.nn.Parameter]) -> torch.optim.SGD:
    """torch's SGD with the task's momentum, Nesterov and weight decay (lr set per step)."""
    spec = ctx.spec
    return torch.optim.SGD(params, lr=0.0, momentum=spec.momentum, nesterov=spec.nesterov,
                           weight_decay=spec.weight_decay)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def allreduce_bytes(numel: int, element_size: int, world_size: int) -> int:
    """Bytes one rank sends in a ring all-reduce of ``numel`` elements: 2 (k-1)/k of the data."""
    if world_size <= 1:
        return 0
    return int(2 * (world_size - 1) * numel * element_size / world_size)


def all_reduce_mean_(tensor: torch.Tensor, world_size: int, group: Any = None) -> None:
    if world_size > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        tensor.div_(world_size)


OPTIMIZERS: dict[str, type[DistributedOptimizer]] = {}


def register(cls: type[DistributedOptimizer]) -> type[DistributedOptimizer]:
    OPTIMIZERS[cls.name] = cls
    return cls


def check_optimizer(name: str, options: dict[str, str]) -> type[DistributedOptimizer]:
    """The optimizer class for ``name``, after checking that it exists and takes ``options``."""
    from mlbench.optim import catalog  # noqa: F401  (registers the optimizers)

    try:
        cls = OPTIMIZERS[name]
    except KeyError:
        raise UsageError(f"unknown optimizer {name!r}; choose one of: {', '.join(sorted(OPTIMIZERS))} "
                         "(see `mlbench optimizers`)") from None
    unknown = set(options) - set(cls.options_help)
    if unknown:
        valid = ", ".join(cls.options_help) or "none"
        raise UsageError(f"optimizer {name} has no option {', '.join(sorted(unknown))}; "
                         f"valid options: {valid}")
    return cls


def build_optimizer(name: str, ctx: OptimizerContext) -> DistributedOptimizer:
    return check_optimizer(name, ctx.options)(ctx)

"""The interface every distributed optimizer implements, and the collectives they share.

A distributed optimizer owns both halves of an update after the backward pass: the
communication (which it times as the "communication" phase and counts in bytes sent) and the
local update (the "optimizer" phase). The worker calls :meth:`DistributedOptimizer.step` once per
minibatch with the learning rate of that step. Encoding and decoding a compressed message count
as communication: they are the price of sending fewer bytes.

Options arrive as text (``--opt KEY=VALUE``); each optimizer's descriptor
(:mod:`mlbench.optim.descriptors`) declares them as ``Option`` values, so that a wrong name or
value is one sentence before any worker starts, and ``mlbench optimizers`` can list them with
their defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from mlbench.errors import UsageError
from mlbench.optim.descriptors import OptimizerInfo, with_grad_hook
from mlbench.optim.hyper import Hyper
from mlbench.timing import PhaseTimer

@dataclass
class OptimizerContext:
    """What an optimizer may use: the model, the task's hyper-parameters as numbers
    (:class:`~mlbench.optim.hyper.Hyper`: no task), the process group."""

    model: torch.nn.Module
    hyper: Hyper
    world_size: int
    rank: int
    timer: PhaseTimer
    options: dict[str, str] = field(default_factory=dict)
    group: Any = None  # torch.distributed ProcessGroup; None = the default group


class DistributedOptimizer:
    """Base class: subclasses implement :meth:`step`; ``bytes_sent`` counts what this rank sent.

    ``module`` is what the trainer forwards through (the model itself, or a wrapper such as
    DistributedDataParallel).
    """

    #: What the optimizer is: name, options, whether it holds the averaged gradient
    #: (mlbench.optim.descriptors, torch-free, what the CLI checks a run against).
    info: ClassVar[OptimizerInfo]

    def __init__(self, ctx: OptimizerContext):
        self.ctx = ctx
        self.opts = self.info.parse_options(ctx.options, ctx.world_size)
        self.module: torch.nn.Module = ctx.model
        self.params = [p for p in ctx.model.parameters() if p.requires_grad]
        self.bytes_sent = 0
        self.grad_hook: Callable[[], bool] | None = None

    def set_grad_hook(self, hook: Callable[[], bool], purpose: str) -> None:
        """Run ``hook()`` on the averaged gradients before every update: what a task must do
        after averaging and before the update (task 3a's gradient clipping, the unscaling of
        fp16 loss scaling). ``hook`` returning False skips that update (an overflow). A method
        of local updates (``info.local_updates``) runs it on each rank's own gradient before its
        inner step. A method whose ranks hold neither refuses, naming ``purpose``."""
        if not self.info.takes_grad_hook:
            usable = ", ".join(with_grad_hook())
            raise UsageError(f"optimizer {self.info.name} cannot {purpose}: it never holds the averaged "
                             f"gradient; use one of {usable}")
        self.grad_hook = hook

    def grad_hook_allows_update(self) -> bool:
        """Call between averaging and updating: False means skip this update."""
        return self.grad_hook is None or bool(self.grad_hook())

    def step(self, lr: float) -> None:
        raise NotImplementedError

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def state_for_eval(self) -> Callable[[], None] | None:
        """Make every rank's model ready for evaluation; return what gives training its own
        state back afterwards (None: nothing to undo; methods whose ranks differ override)."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """What this optimizer carries from step to step (momentum, error feedback, Q matrices,
        counters), for a checkpoint; :mod:`mlbench.optim.state` finds it in the attributes."""
        from mlbench.optim.state import capture
        return capture(self, self.ctx.model)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (:meth:`state_dict` of the same run's optimizer)."""
        from mlbench.optim.state import restore
        restore(self, state)


class ConsensusEvaluation:
    """Evaluate the average of the ranks' models, then give each rank its own model back.

    Methods whose ranks hold different models (gossip, periodic averaging) are analysed through
    the average model (Lian et al. 2017, "Can decentralized algorithms outperform centralized
    algorithms?", Theorem 1): evaluating that average on every rank makes the all-reduced test
    metrics those of one model, and restoring the local models afterwards leaves the training
    trajectory untouched. The averaging all-reduce is evaluation traffic, not counted in
    ``bytes_sent``.
    """

    def __init__(self, params: list[torch.nn.Parameter], world_size: int, group: Any = None):
        self.params = params
        self.world_size = world_size
        self.group = group
        self._saved: list[torch.Tensor] | None = None

    @torch.no_grad()
    def enter(self) -> Callable[[], None] | None:
        """Average the models in place; return the function that restores this rank's own."""
        if self.world_size == 1:
            return None
        data = [p.data for p in self.params]
        self._saved = [t.clone() for t in data]
        flat = _flatten_dense_tensors(data)
        all_reduce_mean_(flat, self.world_size, self.group)
        for t, avg in zip(data, _unflatten_dense_tensors(flat, data)):
            t.copy_(avg)
        return self.exit

    @torch.no_grad()
    def exit(self) -> None:
        for p, saved in zip(self.params, self._saved or []):
            p.data.copy_(saved)
        self._saved = None


def local_sgd(ctx: OptimizerContext, params: list[torch.nn.Parameter]) -> torch.optim.SGD:
    """torch's SGD with the task's momentum, Nesterov and weight decay (lr set per step)."""
    hyper = ctx.hyper
    return torch.optim.SGD(params, lr=0.0, momentum=hyper.momentum, nesterov=hyper.nesterov,
                           weight_decay=hyper.weight_decay)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def allreduce_bytes(numel: int, element_size: int, world_size: int) -> int:
    """Bytes one rank sends in a ring all-reduce of ``numel`` elements: 2 (k-1)/k of the data."""
    if world_size <= 1:
        return 0
    return int(2 * (world_size - 1) * numel * element_size / world_size)


def allgather_bytes(nbytes: int, world_size: int) -> int:
    """Bytes one rank sends in a ring all-gather of ``nbytes`` per rank: its share to k-1 peers."""
    return (world_size - 1) * nbytes


def collectives_issued() -> int | None:
    """The collectives this process has issued on the default group, a point-to-point send or
    receive counting one (gloo's and NCCL's sequence number), or None without a group or where
    torch does not say. The worker records it per step (``comm/collectives``): the messages
    whose latency ``mlbench predict`` charges, as ``comm/bytes`` is the bytes it charges."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    try:
        from torch.distributed.distributed_c10d import _get_default_group

        group: Any = _get_default_group()   # the method is the backends', not in ProcessGroup's stubs
        return int(group._get_sequence_number_for_group())
    except Exception:  # a private API: a torch without it leaves the count out
        return None


def all_reduce_mean_(tensor: torch.Tensor, world_size: int, group: Any = None) -> None:
    if world_size > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        tensor.div_(world_size)


def all_gather(tensor: torch.Tensor, world_size: int, group: Any = None) -> list[torch.Tensor]:
    """Every rank's ``tensor`` (same shape on all ranks), in rank order."""
    if world_size == 1:
        return [tensor]
    out = [torch.empty_like(tensor) for _ in range(world_size)]
    dist.all_gather(out, tensor, group=group)
    return out


def param_grads(params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    """The parameters' gradients; every parameter has one (a backward pass reached it, or the
    optimizer keeps its gradient tensors from the start)."""
    grads = []
    for p in params:
        assert p.grad is not None, "a parameter has no gradient"
        grads.append(p.grad)
    return grads


def flat_grads(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """All gradients in one new flat fp32 vector (zeros for a parameter without a gradient)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in params])


def flat_params(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """The parameters as one vector; a sharded parameter (a DTensor: ``fsdp``) whole, which is
    a collective: every rank must call it."""
    return torch.cat([whole_tensor(p.detach()).reshape(-1) for p in params])


def local_part(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t``: its shard of a sharded parameter (``fsdp``), else ``t``."""
    local = getattr(t, "to_local", None)
    return local() if callable(local) else t


def whole_tensor(t: torch.Tensor) -> torch.Tensor:
    """``t`` whole: a sharded parameter (``fsdp``) gathered from every rank (a collective), else ``t``."""
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t


@torch.no_grad()
def assign_flat_(params: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
    """Copy consecutive slices of ``flat`` into the parameters."""
    offset = 0
    for p in params:
        n = p.numel()
        p.copy_(flat[offset:offset + n].view_as(p))
        offset += n

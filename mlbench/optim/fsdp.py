"""``fsdp``: fully sharded data parallelism, PyTorch's ``fully_shard`` (FSDP2; ZeRO-3).

Each rank keeps 1/k of every parameter, of its gradient and of the optimizer's state
(Rajbhandari et al. 2020, ZeRO stage 3; Zhao et al. 2023, PyTorch FSDP). Before a unit's forward
and again before its backward the ranks all-gather its weights; after its backward they
reduce-scatter its gradients, so that each rank holds the mean gradient of its own shard. The
update is the task's reference rule (SGD with the task's momentum and decay, Adam, or AdamW with
decay on the matrices), applied by each rank to its shard: the same numbers as the all-reduce
reference, with less memory per rank and half again as many bytes per step.

The units are each block of the model's layer lists (every ``nn.ModuleList``'s children, as
torchtitan shards each transformer block) and the model itself (the embeddings, the final norm
and the tied head, whose weights it shares). ``reshard=false`` keeps the gathered weights from
the forward to the backward (ZeRO-2's traffic, more memory).

Bytes: per micro-batch, for each unit, an all-gather for the forward, another for the backward
where the unit reshards, and a reduce-scatter: (k-1)/k of the unit's bytes each, as a ring sends
them (nccl-tests' bus bandwidth). On gloo the reduce-scatter is an all-reduce, which sends twice
that. ``mlbench check-optimizer fsdp`` holds these counts to what the ranks' sockets sent.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mlbench.optim.base import DistributedOptimizer, OptimizerContext, local_sgd, set_lr
from mlbench.optim.centralized import adam_update, adamw_update
from mlbench.optim.descriptors import INFO, optimizer_info
from mlbench.optim.hyper import Hyper
from mlbench.optim.registry import register


def _units(model: nn.Module) -> list[nn.Module]:
    """The blocks to shard one by one: the children of every layer list, outermost first."""
    return [child for module in model.modules() if isinstance(module, nn.ModuleList) for child in module]


def _reference_options(hyper: Hyper) -> dict[str, Any] | None:
    """The options of the task's reference optimizer where it is Adam or AdamW: its defaults with
    the task's values (None: the task's reference is SGD)."""
    if hyper.reference not in ("centralized-adam", "centralized-adamw"):
        return None
    return {**optimizer_info(hyper.reference).parse_options({}, None), **hyper.reference_options()}


def _task_update(ctx: OptimizerContext, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """The task's reference update on ``params``: what the task's reference optimizer applies
    after its all-reduce, with its defaults and the task's values of its options."""
    o = _reference_options(ctx.hyper)
    if o is None:
        return local_sgd(ctx, params)
    update = adam_update if ctx.hyper.reference == "centralized-adam" else adamw_update
    return update(params, o, ctx.hyper.weight_decay)


def _rate_factor(hyper: Hyper) -> float:
    """The reference update's rate over the task's (computed from the context, not kept: a
    resumed run on another worker count has another ``peak_lr``)."""
    o = _reference_options(hyper)
    return 1.0 if o is None else hyper.rate_factor(o)


@register
class FullyShardedDataParallel(DistributedOptimizer):
    info = INFO["fsdp"]

    def __init__(self, ctx: OptimizerContext):
        from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
        from torch.distributed.fsdp import fully_shard

        model = ctx.model
        device = next(model.parameters()).device
        mesh = init_device_mesh(device.type, (ctx.world_size,)) if ctx.group is None \
            else DeviceMesh.from_group(ctx.group, device.type)
        reshard = bool(self.info.parse_options(ctx.options, ctx.world_size)["reshard"])
        self.unit_sizes: list[tuple[int, bool]] = []
        inner: set[int] = set()
        for unit in _units(model):
            own = [p for p in unit.parameters() if id(p) not in inner]
            inner.update(id(p) for p in own)
            self.unit_sizes.append((sum(p.numel() * p.element_size() for p in own), reshard))
            fully_shard(unit, mesh=mesh, reshard_after_forward=reshard)
        rest = [p for p in model.parameters() if id(p) not in inner]
        # the root's weights stay gathered from its forward to its backward (FSDP2's default
        # for the root, which runs its backward first)
        self.unit_sizes.append((sum(p.numel() * p.element_size() for p in rest), False))
        fully_shard(model, mesh=mesh, reshard_after_forward=None if reshard else False)   # None: FSDP2's own
        super().__init__(ctx)   # the parameters are the sharded ones from here on
        self.local = _task_update(ctx, self.params)
        self.micro_batches = 0
        model.register_forward_pre_hook(self._count)
        import torch.distributed as dist

        # torch's gloo group has no reduce-scatter of its own: it all-reduces, which sends twice
        # the bytes (measured by check-optimizer); NCCL's ring sends (k-1)/k of the data
        self.scatter_factor = 2 if dist.get_backend(ctx.group) == "gloo" else 1

    def _count(self, module: nn.Module, args: Any) -> None:
        if torch.is_grad_enabled() and module.training:
            self.micro_batches += 1

    def _bytes_per_micro_batch(self) -> int:
        k = self.ctx.world_size
        if k == 1:
            return 0
        gathers = sum((2 if reshard else 1) * size * (k - 1) // k for size, reshard in self.unit_sizes)
        scatters = sum(size * (k - 1) // k for size, _ in self.unit_sizes)
        return gathers + self.scatter_factor * scatters

    def step(self, lr: float) -> None:
        # the reduce-scatters ran in the backward passes; the update is each rank's shard's
        self.bytes_sent += self.micro_batches * self._bytes_per_micro_batch()
        self.micro_batches = 0
        self.ctx.timer.mark("communication")
        if self.grad_hook_allows_update():
            set_lr(self.local, lr * _rate_factor(self.ctx.hyper))
            self.local.step()
        self.ctx.timer.mark("optimizer")

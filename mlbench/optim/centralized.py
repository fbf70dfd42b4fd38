"""Centralized (all-reduce) SGD: the reference algorithm of the closed division.

Each worker computes the gradient of its minibatch; the gradients are averaged with an
all-reduce after every minibatch, and every worker applies the same SGD update (SPEC.md, task 1a
"Algorithm"). No overlap with the backward pass: this is the reference that other methods are
compared against. ``by=model`` packs all gradients into one flat buffer and does one collective;
``by=layer`` does one collective per tensor (the original's two modes).
"""

from __future__ import annotations

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from mlbench.optim.base import (DistributedOptimizer, OptimizerContext, all_reduce_mean_,
                                allreduce_bytes, local_sgd, register, set_lr)
from mlbench.errors import UsageError


def average_gradients(params: list[torch.nn.Parameter], world_size: int, by: str, group=None) -> int:
    """All-reduce-average the gradients in place; returns the bytes this rank sent."""
    grads = [p.grad for p in params]
    if by == "model":
        flat = _flatten_dense_tensors(grads)
        all_reduce_mean_(flat, world_size, group)
        for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
            g.copy_(synced)
        return allreduce_bytes(flat.numel(), flat.element_size(), world_size)
    sent = 0
    for g in grads:
        all_reduce_mean_(g, world_size, group)
        sent += allreduce_bytes(g.numel(), g.element_size(), world_size)
    return sent


def aggregation_mode(options: dict[str, str]) -> str:
    by = options.get("by", "model")
    if by not in ("model", "layer"):
        raise UsageError(f"option by={by}: expected by=model or by=layer")
    return by


@register
class CentralizedSGD(DistributedOptimizer):
    name = "centralized-sgd"
    reference = "Synchronous SGD with gradient all-reduce (Goyal et al. 2017; MLBench task 1a)"
    closed_division = True
    options_help = {"by": "model (one all-reduce of all gradients, default) or layer (one per tensor)"}

    def __init__(self, ctx: OptimizerContext):
        super().__init__(ctx)
        self.by = aggregation_mode(ctx.options)
        self.local = local_sgd(ctx, self.params)

    def step(self, lr: float) -> None:
        self.bytes_sent += average_gradients(self.params, self.ctx.world_size, self.by, self.ctx.group)
        self.ctx.timer.mark("communication")
        set_lr(self.local, lr)
        self.local.step()
        self.ctx.timer.mark("optimizer")

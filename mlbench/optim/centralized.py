"""Centralized methods: every rank applies the same update, built from an all-reduce.

- ``centralized-sgd``, the reference of the closed division: each worker computes the gradient
  of its minibatch; the gradients are averaged with an all-reduce after every minibatch, and
  every worker applies the same SGD update (SPEC.md, task 1a "Algorithm"). No overlap with the
  backward pass: this is the reference that other methods are compared against.
- ``centralized-adam``: the same all-reduce, then Adam (Kingma & Ba 2015) instead of SGD, as
  the original's CentralizedAdam (seed 003, "Centralized ADAM").
- ``model-averaging``: each worker takes a local SGD step and then the weights are averaged
  (the original's ``agg_grad=False``); with ``period=H`` every H steps, which is local SGD
  (Stich 2019, "Local SGD converges fast and communicates little"; Lin et al. 2020, "Don't use
  large mini-batches, use local SGD"). Without momentum and with H=1 it is exactly centralized
  SGD, since averaging is linear.

``by=model`` packs all tensors into one flat buffer and does one collective; ``by=layer`` does
one collective per tensor (the original's two modes): the same numbers, a different count of
messages, which is what a latency-bound network feels.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from mlbench.optim.base import (ConsensusEvaluation, DistributedOptimizer, Option, OptimizerContext,
                                all_reduce_mean_, allreduce_bytes, local_sgd, register, set_lr)

BY = Option("model (one all-reduce of all tensors) or layer (one all-reduce per tensor)", "model",
            kind="choice", choices=("model", "layer"))


def average_tensors(tensors: list[torch.Tensor], world_size: int, by: str, group: Any = None) -> int:
    """All-reduce-average the tensors in place; returns the bytes this rank sent.

    One worker has nothing to average: no packing into a flat buffer, no copies back.
    """
    if world_size == 1:
        return 0
    if by == "model":
        flat = _flatten_dense_tensors(tensors)
        all_reduce_mean_(flat, world_size, group)
        for t, synced in zip(tensors, _unflatten_dense_tensors(flat, tensors)):
            t.copy_(synced)
        return allreduce_bytes(flat.numel(), flat.element_size(), world_size)
    sent = 0
    for t in tensors:
        all_reduce_mean_(t, world_size, group)
        sent += allreduce_bytes(t.numel(), t.element_size(), world_size)
    return sent


def average_gradients(params: list[torch.nn.Parameter], world_size: int, by: str, group: Any = None) -> int:
    """All-reduce-average the gradients in place; returns the bytes this rank sent."""
    return average_tensors([p.grad for p in params], world_size, by, group)


@register
class CentralizedSGD(DistributedOptimizer):
    name = "centralized-sgd"
    reference = "Synchronous SGD with gradient all-reduce (Goyal et al. 2017; MLBench task 1a)"
    summary = "The reference: average the gradients with an all-reduce, then the same SGD step everywhere."
    closed_division = True
    options = {"by": BY}
    supports_grad_hook = True

    def __init__(self, ctx: OptimizerContext):
        super().__init__(ctx)
        self.by = self.opts["by"]
        self.local = local_sgd(ctx, self.params)

    def step(self, lr: float) -> None:
        self.bytes_sent += average_gradients(self.params, self.ctx.world_size, self.by, self.ctx.group)
        self.ctx.timer.mark("communication")
        if self.grad_hook_allows_update():
            set_lr(self.local, lr)
            self.local.step()
        self.ctx.timer.mark("optimizer")


@register
class CentralizedAdam(DistributedOptimizer):
    name = "centralized-adam"
    reference = "Adam (Kingma & Ba 2015, arXiv:1412.6980) on all-reduced gradients (seed 003)"
    summary = "Average the gradients with an all-reduce, then the same Adam step everywhere."
    options = {
        "by": BY,
        "lr_scale": Option("Adam's rate = the task's rate x lr_scale (Adam wants ~1e-3, not SGD's 0.1)",
                           0.08, kind="float", minimum=0.0),
        "beta1": Option("first-moment decay", 0.9, kind="float", minimum=0.0, maximum=1.0),
        "beta2": Option("second-moment decay", 0.999, kind="float", minimum=0.0, maximum=1.0),
        "eps": Option("denominator term", 1e-8, kind="float", minimum=0.0),
    }
    supports_grad_hook = True

    def __init__(self, ctx: OptimizerContext):
        super().__init__(ctx)
        # A task whose reference optimizer is Adam (4b) states its own values in
        # spec.extra["adam"]; they replace the defaults, not what the user set.
        task_values = {k: v for k, v in ctx.spec.extra.get("adam", {}).items() if k not in ctx.options}
        o = self.opts = {**self.opts, **task_values}
        self.by = o["by"]
        self.local = torch.optim.Adam(self.params, lr=0.0, betas=(o["beta1"], o["beta2"]), eps=o["eps"],
                                      weight_decay=ctx.spec.weight_decay)

    def step(self, lr: float) -> None:
        self.bytes_sent += average_gradients(self.params, self.ctx.world_size, self.by, self.ctx.group)
        self.ctx.timer.mark("communication")
        if self.grad_hook_allows_update():
            set_lr(self.local, lr * self.opts["lr_scale"])
            self.local.step()
        self.ctx.timer.mark("optimizer")


@register
class ModelAveraging(DistributedOptimizer):
    name = "model-averaging"
    reference = ("Model averaging / local SGD (Stich 2019, arXiv:1805.09767; Lin et al. 2020, "
                 "arXiv:1808.07217); the original's agg_grad=False")
    summary = "A local SGD step on each worker, then the weights are averaged (every `period` steps)."
    options = {
        "by": BY,
        "period": Option("average the weights every this many steps (1: after every step)", 1,
                         kind="int", minimum=1),
    }

    def __init__(self, ctx: OptimizerContext):
        super().__init__(ctx)
        self.by = self.opts["by"]
        self.period = self.opts["period"]
        self.local = local_sgd(ctx, self.params)
        self.since_average = 0
        self.consensus = ConsensusEvaluation(self.params, ctx.world_size, ctx.group)

    def step(self, lr: float) -> None:
        set_lr(self.local, lr)
        self.local.step()
        self.ctx.timer.mark("optimizer")
        self.since_average += 1
        if self.since_average == self.period:
            with torch.no_grad():
                self.bytes_sent += average_tensors([p.data for p in self.params], self.ctx.world_size,
                                                   self.by, self.ctx.group)
            self.since_average = 0
        self.ctx.timer.mark("communication")

    def state_for_eval(self) -> Callable[[], None] | None:
        return self.consensus.enter() if self.since_average else None

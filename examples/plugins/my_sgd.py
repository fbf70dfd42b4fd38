"""A complete optimizer plug-in for mlbench (docs/plugins.md): synchronous SGD whose gradients
are averaged with one all-reduce every step, with an option that scales the task's rate.

    mlbench run task2a 2 --optimizer examples/plugins/my_sgd.py:MySGD --opt lr_scale=0.5
"""

from __future__ import annotations

import torch

from mlbench.optim.base import DistributedOptimizer, OptimizerContext, all_reduce_mean_, allreduce_bytes
from mlbench.optim.descriptors import Option, OptimizerInfo


class MySGD(DistributedOptimizer):
    """Average the gradients (all-reduce), then plain SGD with the task's rate x ``lr_scale``."""

    info = OptimizerInfo(
        name="my-sgd",
        reference="Robbins & Monro 1951; the all-reduce as in Goyal et al. 2017 (arXiv:1706.02677)",
        summary="Gradients averaged by one all-reduce, then plain SGD (no momentum).",
        options={"lr_scale": Option("the step is the task's rate x lr_scale", 1.0, kind="float", minimum=0.0)},
        exact=True,  # k workers x batch b = 1 process x batch k*b: `mlbench check-optimizer` checks it
    )

    def __init__(self, ctx: OptimizerContext):
        super().__init__(ctx)  # checks the options: self.opts["lr_scale"] is a float

    @torch.no_grad()
    def step(self, lr: float) -> None:
        # what came before this mark since the backward pass is communication (DistributedOptimizer)
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        all_reduce_mean_(flat, self.ctx.world_size, self.ctx.group)
        self.bytes_sent += allreduce_bytes(flat.numel(), flat.element_size(), self.ctx.world_size)
        self.ctx.timer.mark("communication")
        offset = 0
        for p in self.params:
            n = p.numel()
            p.add_(flat[offset:offset + n].view_as(p), alpha=-lr * self.opts["lr_scale"])
            offset += n
        self.ctx.timer.mark("optimizer")

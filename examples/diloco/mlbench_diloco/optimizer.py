"""DiLoCo: Distributed Low-Communication training (Douillard et al. 2023, arXiv:2311.08105).

Each worker takes ``H`` local AdamW steps (the inner optimizer, its state kept across rounds, as
in the paper's Algorithm 1); then the pseudo-gradient, the round's start minus the worker's
parameters now, is averaged over the workers with one all-reduce, and an outer SGD step with
Nesterov momentum (the paper's outer lr 0.7 and momentum 0.9) moves the round's start; every
worker continues from there. One all-reduce of the model every ``H`` steps: that, and nothing
else, is what it sends.

Between two rounds the workers' models differ; evaluation sees their average and gives each its
own back afterwards (mlbench.optim.base.ConsensusEvaluation, as model-averaging does).

With ``H=2 outer_lr=1 outer_momentum=0`` it is model averaging of AdamW every 2 steps (the new
start is the mean of the workers' parameters), which is how its test checks it. This file is
the whole plug-in: a run keeps it (and only it) beside the run's record.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from mlbench.optim.base import (
    ConsensusEvaluation,
    DistributedOptimizer,
    OptimizerContext,
    all_reduce_mean_,
    allreduce_bytes,
    set_lr,
)
from mlbench.optim.descriptors import Option, OptimizerInfo


class DiLoCo(DistributedOptimizer):
    """H inner AdamW steps per worker, then an outer Nesterov step on the averaged pseudo-gradient."""

    info = OptimizerInfo(
        name="example-diloco",
        reference="Douillard et al. 2023, DiLoCo: Distributed Low-Communication Training of Language "
                  "Models (arXiv:2311.08105)",
        summary="H local AdamW steps, then one all-reduce of the pseudo-gradient and an outer Nesterov step.",
        options={
            "H": Option("inner steps per round (one all-reduce of the model per round)", 10, kind="int", minimum=1),
            "inner_lr_scale": Option("AdamW's rate = the task's rate x inner_lr_scale", 0.08, kind="float",
                                     minimum=0.0),
            "outer_lr": Option("outer SGD's learning rate", 0.7, kind="float", minimum=0.0),
            "outer_momentum": Option("outer SGD's Nesterov momentum", 0.9, kind="float", minimum=0.0, maximum=1.0),
        },
        ranks_differ=lambda values: values["H"] > 1,
    )

    def __init__(self, ctx: OptimizerContext):
        super().__init__(ctx)
        self.inner = torch.optim.AdamW(self.params, lr=0.0, weight_decay=ctx.spec.settings.weight_decay)
        with torch.no_grad():
            self.start = _flatten_dense_tensors([p.detach() for p in self.params]).clone()
        self.momentum = torch.zeros_like(self.start)
        self.since_round = 0
        self.consensus = ConsensusEvaluation(self.params, ctx.world_size, ctx.group)

    def step(self, lr: float) -> None:
        set_lr(self.inner, lr * self.opts["inner_lr_scale"])
        self.inner.step()
        self.ctx.timer.mark("optimizer")
        self.since_round += 1
        if self.since_round == self.opts["H"]:
            self._outer_step()
            self.since_round = 0
        self.ctx.timer.mark("communication")

    @torch.no_grad()
    def _outer_step(self) -> None:
        tensors = [p.data for p in self.params]
        pseudo_gradient = self.start - _flatten_dense_tensors(tensors)
        all_reduce_mean_(pseudo_gradient, self.ctx.world_size, self.ctx.group)
        self.bytes_sent += allreduce_bytes(pseudo_gradient.numel(), pseudo_gradient.element_size(),
                                           self.ctx.world_size)
        mu = self.opts["outer_momentum"]
        self.momentum.mul_(mu).add_(pseudo_gradient)
        update = pseudo_gradient.add_(self.momentum, alpha=mu) if mu else pseudo_gradient
        self.start.sub_(update, alpha=self.opts["outer_lr"])
        for t, value in zip(tensors, _unflatten_dense_tensors(self.start, tensors)):
            t.copy_(value)

    def state_for_eval(self) -> Callable[[], None] | None:
        return self.consensus.enter() if self.since_round else None

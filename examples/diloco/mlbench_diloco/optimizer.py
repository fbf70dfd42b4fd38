"""DiLoCo: Distributed Low-Communication training (Douillard et al. 2023, arXiv:2311.08105).

Each worker takes ``H`` local AdamW steps (the inner optimizer, weight decay 0.1 and its state
kept across rounds, as in the paper's Algorithm 1 and its section 3); then the pseudo-gradient,
the round's start minus the worker's parameters now, is averaged over the workers with one
all-reduce, and an outer SGD step with Nesterov momentum (the paper's outer lr 0.7 and momentum
0.9) moves the round's start, the global model; every worker continues from there. One
all-reduce of the model every ``H`` steps: that, and nothing else, is what it sends.

Between two rounds the workers' models differ. Evaluation scores the global model, what DiLoCo
deploys, and gives each worker its own back afterwards. Buffers (BatchNorm's statistics) stay
each worker's own: the built-in ``diloco`` also averages them once a round.

Its test (tests/optim/test_diloco.py) checks it against the algorithm written out independently,
at the paper's outer values and at ``outer_lr=1 outer_momentum=0`` (model averaging of AdamW
every ``H`` steps). A run keeps this package's files that it imports (this module and
``__init__.py``) beside the run's record.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from mlbench.optim.base import (
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
            "inner_weight_decay": Option("AdamW's weight decay (the paper's 0.1)", 0.1, kind="float", minimum=0.0),
            "outer_lr": Option("outer SGD's learning rate", 0.7, kind="float", minimum=0.0),
            "outer_momentum": Option("outer SGD's Nesterov momentum", 0.9, kind="float", minimum=0.0, maximum=1.0),
        },
        ranks_differ=lambda values: values["H"] > 1,
        period="H",   # one all-reduce every H steps: check-optimizer trains over two of them
    )

    def __init__(self, ctx: OptimizerContext):
        super().__init__(ctx)
        self.inner = torch.optim.AdamW(self.params, lr=0.0, weight_decay=self.opts["inner_weight_decay"])
        with torch.no_grad():
            self.start = _flatten_dense_tensors([p.detach() for p in self.params]).clone()
        self.momentum = torch.zeros_like(self.start)
        self.since_round = 0

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

    @torch.no_grad()
    def state_for_eval(self) -> Callable[[], None] | None:
        """The global model (the round's start) in the parameters; what gives the worker's own back."""
        if not self.since_round:
            return None   # just after an outer step every worker holds the global model
        tensors = [p.data for p in self.params]
        own = _flatten_dense_tensors(tensors).clone()
        for t, value in zip(tensors, _unflatten_dense_tensors(self.start, tensors)):
            t.copy_(value)

        def restore() -> None:
            with torch.no_grad():
                for t, value in zip(tensors, _unflatten_dense_tensors(own, tensors)):
                    t.copy_(value)
        return restore

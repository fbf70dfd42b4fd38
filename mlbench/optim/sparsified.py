"""Sparsified SGD with memory: send k of the model's d coordinates, remember the rest.

Stich, Cordonnier & Jaggi 2018, "Sparsified SGD with Memory" (NeurIPS, arXiv:1809.07599),
Algorithm 1, run on every worker: with the worker's momentum m (weight decay included),

    p = lr * m + memory        s = comp_k(p)        memory <- p - s

where comp_k keeps the k largest |p_j| (``method=topk``) or k coordinates drawn at random
(``method=randomk``, a different draw on every rank and step) and zeroes the others. The workers
exchange (index, value) pairs by all-gather (8 bytes per kept coordinate) and every rank applies
the average of the k sparse vectors, so all models stay equal. Nothing is lost: after any number
of steps, the memory plus everything a worker sent equals the sum of its lr-scaled momenta (the
error-feedback invariant), which is why the method converges at SGD's rate for k << d.
"""

from __future__ import annotations

import torch

from mlbench.optim.base import (
    DistributedOptimizer,
    OptimizerContext,
    all_gather,
    allgather_bytes,
    assign_flat_,
    flat_grads,
    flat_params,
)
from mlbench.optim.compression import LocalMomentum
from mlbench.optim.descriptors import INFO
from mlbench.optim.registry import register


@register
class SparsifiedSGD(DistributedOptimizer):
    info = INFO["sparsified-sgd"]

    def __init__(self, ctx: OptimizerContext):
        super().__init__(ctx)
        self.method = self.opts["method"]
        self.numel = sum(p.numel() for p in self.params)
        self.k = max(1, int(self.opts["ratio"] * self.numel))
        self.momentum = LocalMomentum(ctx.hyper.momentum, ctx.hyper.weight_decay)
        self.generator = torch.Generator().manual_seed(self.opts["seed"] + ctx.rank)
        self.memory: torch.Tensor | None = None

    def _select(self, p: torch.Tensor) -> torch.Tensor:
        if self.method == "topk":
            return p.abs().topk(self.k, sorted=False).indices
        return torch.randperm(self.numel, generator=self.generator)[:self.k].to(p.device)

    @torch.no_grad()
    def step(self, lr: float) -> None:
        x = flat_params(self.params)
        m = self.momentum(flat_grads(self.params), x)
        p = m * lr if self.memory is None else self.memory.add(m, alpha=lr)
        index = self._select(p)
        values = p[index]
        p[index] = 0
        self.memory = p
        world, group = self.ctx.world_size, self.ctx.group
        indices = all_gather(index.to(torch.int32), world, group)
        all_values = all_gather(values, world, group)
        self.bytes_sent += allgather_bytes(self.k * (4 + values.element_size()), world)
        update = torch.zeros_like(x)
        for idx, val in zip(indices, all_values):
            update.index_add_(0, idx.long(), val)
        self.ctx.timer.mark("communication")
        assign_flat_(self.params, x.sub_(update.div_(world)))
        self.ctx.timer.mark("optimizer")

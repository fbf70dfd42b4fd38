"""signSGD with majority vote, and its error-feedback variant: one bit per coordinate.

Majority vote (default; Bernstein, Zhao, Azizzadenesheli & Anandkumar 2018, "signSGD with
Majority Vote is Communication Efficient and Fault Tolerant", arXiv:1810.05291, Algorithm 1 with
momentum, i.e. Signum): each worker sends the signs of its momentum, packed 8 per byte and
exchanged by all-gather; every rank then computes the same vote and steps
``x <- x - lr * lr_scale * sign(sum_i sign(m_i))`` (a tie, possible with an even number of
workers, leaves the coordinate unchanged). The step moves every coordinate by the same amount,
so it needs a rate far below SGD's: ``lr_scale`` maps the task's schedule onto it (or ``lr``,
an absolute peak: the schedule's shape with that peak).

Error feedback (``error_feedback=true``; Karimireddy, Rebjock, Stich & Jaggi 2019, "Error
Feedback Fixes SignSGD and other Gradient Compression Schemes", arXiv:1901.09847, Algorithm 1,
EF-SignSGD): each worker compresses ``p = lr * m + e`` to the scaled sign
``delta = (|p|_1 / d) sign(p)`` per tensor, keeps ``e = p - delta`` for the next step, and sends the
bits plus one scale per tensor; every rank applies the average of the workers' deltas. The scale
keeps the step's magnitude, so the task's own rate is used.
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
from mlbench.optim.compression import (
    LocalMomentum,
    Segments,
    count_positive,
    pack_signs,
    signs,
    unpack_signs,
)
from mlbench.optim.descriptors import INFO
from mlbench.optim.registry import register


@register
class SignSGD(DistributedOptimizer):
    info = INFO["signsgd"]

    def __init__(self, ctx: OptimizerContext):
        super().__init__(ctx)
        self.error_feedback = self.opts["error_feedback"]
        self.momentum = LocalMomentum(ctx.hyper.momentum, ctx.hyper.weight_decay)
        self.segments = Segments(self.params)
        self.numel = sum(p.numel() for p in self.params)
        self.memory: torch.Tensor | None = None

    @torch.no_grad()
    def step(self, lr: float) -> None:
        x = flat_params(self.params)
        m = self.momentum(flat_grads(self.params), x)
        world, group = self.ctx.world_size, self.ctx.group
        if self.error_feedback:
            update = self._error_feedback_update(lr, m)
        else:
            packed = pack_signs(m)
            votes = 2 * count_positive(all_gather(packed, world, group), self.numel) - world
            self.bytes_sent += allgather_bytes(packed.numel(), world)
            update = torch.sign(votes).to(x.dtype).mul_(lr * self.ctx.hyper.rate_factor(self.opts))
        self.ctx.timer.mark("communication")
        assign_flat_(self.params, x.sub_(update))
        self.ctx.timer.mark("optimizer")

    def _error_feedback_update(self, lr: float, m: torch.Tensor) -> torch.Tensor:
        world, group = self.ctx.world_size, self.ctx.group
        p = m * lr if self.memory is None else self.memory.add(m, alpha=lr)
        scales = self.segments.mean_abs(p)
        self.memory = p - signs(p) * self.segments.expand(scales)
        packed = pack_signs(p)
        all_packed = all_gather(packed, world, group)
        all_scales = all_gather(scales, world, group)
        self.bytes_sent += allgather_bytes(packed.numel() + scales.numel() * scales.element_size(), world)
        update = torch.zeros_like(p)
        for bits, scale in zip(all_packed, all_scales):
            update.add_(unpack_signs(bits, self.numel, p.dtype) * self.segments.expand(scale))
        return update.div_(world)

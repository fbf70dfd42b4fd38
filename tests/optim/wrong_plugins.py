"""Deliberately wrong optimizer plug-ins: each breaks one thing `mlbench check-optimizer` checks
(tests/optim/test_check.py). ``_SGD`` is a correct one: gradients averaged, then plain SGD."""

import os

import torch
import torch.distributed as dist

from mlbench.optim.base import DistributedOptimizer, allreduce_bytes
from mlbench.optim.descriptors import OptimizerInfo


class _SGD(DistributedOptimizer):

    @torch.no_grad()
    def step(self, lr):
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        self.communicate(flat)
        offset = 0
        for p in self.params:
            p.add_(flat[offset:offset + p.numel()].view_as(p), alpha=-self.rate(lr))
            offset += p.numel()

    def communicate(self, flat):
        dist.all_reduce(flat)
        flat.div_(self.ctx.world_size)
        self.bytes_sent += allreduce_bytes(flat.numel(), 4, self.ctx.world_size)

    def rate(self, lr):
        return lr


class NoDivide(_SGD):
    info = OptimizerInfo("no-divide", "-", "sums the gradients instead of averaging them", exact=True)

    def communicate(self, flat):
        dist.all_reduce(flat)
        self.bytes_sent += allreduce_bytes(flat.numel(), 4, self.ctx.world_size)


class Flatterer(_SGD):
    info = OptimizerInfo("flatterer", "-", "reports 1/32 of what it sends", exact=True)

    def communicate(self, flat):
        super().communicate(flat)
        self.bytes_sent //= 32


class Drifter(_SGD):
    info = OptimizerInfo("drifter", "-", "rank 1 keeps its own gradient")

    def communicate(self, flat):
        own = flat.clone()
        super().communicate(flat)
        if self.ctx.rank == 1:
            flat.copy_(own)


class Noisy(_SGD):
    info = OptimizerInfo("noisy", "-", "adds noise from the OS, not from the seed")

    def communicate(self, flat):
        super().communicate(flat)
        flat.add_(float(int.from_bytes(os.urandom(2), "little")) * 1e-6)


class Exploding(_SGD):
    info = OptimizerInfo("exploding", "-", "an infinite rate")

    def rate(self, lr):
        return float("inf")


class Skipper(_SGD):
    info = OptimizerInfo("skipper", "-", "rank 1 skips the all-reduce")

    def communicate(self, flat):
        if self.ctx.rank == 0:
            super().communicate(flat)


class Raiser(_SGD):
    info = OptimizerInfo("raiser", "-", "raises in its second step")
    count = 0

    def communicate(self, flat):
        self.count += 1
        if self.count == 2:
            raise ValueError("boom")
        super().communicate(flat)


class Unaveraged(_SGD):
    info = OptimizerInfo("unaveraged", "-", "declares that its ranks differ, but evaluates each rank's own model",
                         ranks_differ=True)

    def communicate(self, flat):
        pass

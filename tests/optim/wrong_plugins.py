"""Deliberately wrong optimizer plug-ins: each breaks one thing `mlbench check-optimizer` checks
(tests/optim/test_check.py). ``_SGD`` is a correct one: gradients averaged, then plain SGD."""

import os
import threading

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from mlbench.optim.base import (DistributedOptimizer, all_gather, all_reduce_mean_, allgather_bytes, allreduce_bytes,
                                assign_flat_, flat_params, local_sgd, set_lr)
from mlbench.optim.centralized import average_tensors
from mlbench.optim.descriptors import Option, OptimizerInfo


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


# -- what a check of 2 workers and 5 steps does not see --------------------------------------------
class _LocalRounds(DistributedOptimizer):
    """DiLoCo's shape: ``H`` local SGD steps, then the ranks average what they moved into the
    global model, which evaluation scores."""

    options = {"H": Option("local steps per round", 4, kind="int", minimum=1)}

    def __init__(self, ctx):
        super().__init__(ctx)
        self.local = local_sgd(ctx, self.params)
        self.global_weights = [p.detach().clone() for p in self.params]
        self.count = 0

    def step(self, lr):
        set_lr(self.local, lr)
        self.local.step()
        self.count += 1
        if self.count % self.opts["H"] == 0:
            self.synchronise()

    @torch.no_grad()
    def synchronise(self):
        delta = [g - p for g, p in zip(self.global_weights, self.params)]
        self.average(delta)
        for g, d, p in zip(self.global_weights, delta, self.params):
            g.sub_(d)
            p.copy_(g)

    def average(self, delta):
        self.bytes_sent += average_tensors(delta, self.ctx.world_size, "model", self.ctx.group)

    def state_for_eval(self):
        saved = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            for p, g in zip(self.params, self.global_weights):
                p.copy_(g)

        def restore():
            with torch.no_grad():
                for p, s in zip(self.params, saved):
                    p.copy_(s)
        return restore


class IdleRounds(_LocalRounds):
    info = OptimizerInfo("idle-rounds", "-", "takes ctx.group None for one process: it never synchronises on the "
                         "default group", options=_LocalRounds.options, ranks_differ=True, period="H")

    def synchronise(self):
        if self.ctx.group is None:   # one process: nothing to average
            return
        super().synchronise()


class Miscounted(_LocalRounds):
    info = OptimizerInfo("miscounted", "-", "counts the pseudo-gradient's tensors, not its entries",
                         options={"H": Option("local steps per round", 10, kind="int", minimum=1)},
                         ranks_differ=True, period="H")

    def average(self, delta):
        flat = _flatten_dense_tensors(delta)
        all_reduce_mean_(flat, self.ctx.world_size, self.ctx.group)
        for d, synced in zip(delta, _unflatten_dense_tensors(flat, delta)):
            d.copy_(synced)
        self.bytes_sent += allreduce_bytes(len(delta), 4, self.ctx.world_size)


class AliasedEMA(_SGD):
    info = OptimizerInfo("aliased-ema", "-", "evaluates an average of the iterates; its restore copies back views "
                         "of the parameters, which evaluation overwrote")

    def __init__(self, ctx):
        super().__init__(ctx)
        self.ema = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def step(self, lr):
        super().step(lr)
        for e, p in zip(self.ema, self.params):
            e.mul_(0.9).add_(p, alpha=0.1)

    @torch.no_grad()
    def state_for_eval(self):
        saved = [p.data for p in self.params]
        for p, e in zip(self.params, self.ema):
            p.copy_(e)

        def restore():
            with torch.no_grad():
                for p, s in zip(self.params, saved):
                    p.copy_(s)
        return restore


class GroupAccountant(_SGD):
    info = OptimizerInfo("group-accountant", "-", "rank 0, the one that logs, counts the whole group's bytes",
                         exact=True)

    def communicate(self, flat):
        dist.all_reduce(flat)
        flat.div_(self.ctx.world_size)
        if self.ctx.rank == 0:
            self.bytes_sent += self.ctx.world_size * allreduce_bytes(flat.numel(), 4, self.ctx.world_size)


class Delayed(_SGD):
    info = OptimizerInfo("delayed", "-", "applies the averaged gradient of `delay` steps before; keeps every one",
                         options={"delay": Option("steps between a gradient and its update", 1, kind="int",
                                                  minimum=0)})

    def __init__(self, ctx):
        super().__init__(ctx)
        self.count = 0
        self.averaged = {}

    @torch.no_grad()
    def step(self, lr):
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        self.communicate(flat)
        self.averaged[self.count] = flat
        update = self.averaged.get(self.count - self.opts["delay"])
        self.count += 1
        if update is not None:
            assign_flat_(self.params, flat_params(self.params) - lr * update)


class Hierarchical(_SGD):
    info = OptimizerInfo("hierarchical", "-", "averages within pairs of ranks (a node's two GPUs), then sums across "
                         "the pairs", exact=True)

    def __init__(self, ctx):
        super().__init__(ctx)
        k, rank = ctx.world_size, ctx.rank
        for lo in range(0, k, 2):   # every rank makes every group, in one order
            members = list(range(lo, min(lo + 2, k)))
            group = dist.new_group(members)
            if rank in members:
                self.pair = group, len(members)
        for first in range(min(2, k)):
            members = list(range(first, k, 2))
            group = dist.new_group(members)
            if rank in members:
                self.across = group, len(members)

    def communicate(self, flat):
        group, size = self.pair
        dist.all_reduce(flat, group=group)
        flat.div_(size)
        self.bytes_sent += allreduce_bytes(flat.numel(), 4, size)
        group, size = self.across
        if size > 1:
            dist.all_reduce(flat, group=group)
            self.bytes_sent += allreduce_bytes(flat.numel(), 4, size)


class LateCompressor(_SGD):
    info = OptimizerInfo("late-compressor", "-", "after a dense warm-up, top-k with error feedback; each rank adds "
                         "its own memory to the update",
                         options={"warmup": Option("dense steps first", 7, kind="int", minimum=0),
                                  "ratio": Option("share of the entries sent", 0.01, kind="float", minimum=0.0)})

    def __init__(self, ctx):
        super().__init__(ctx)
        self.count = 0
        self.memory = torch.zeros(sum(p.numel() for p in self.params))

    def communicate(self, flat):
        self.count += 1
        if self.count <= self.opts["warmup"]:
            return super().communicate(flat)
        acc = flat + self.memory
        k = max(1, int(self.opts["ratio"] * acc.numel()))
        indices = acc.abs().topk(k).indices
        values = acc[indices]
        self.memory = acc.clone()
        self.memory[indices] = 0
        message = torch.cat([indices.to(torch.float32), values])
        everyone = all_gather(message, self.ctx.world_size)
        self.bytes_sent += allgather_bytes(message.numel() * 4, self.ctx.world_size)
        flat.zero_()
        for received in everyone:
            flat.index_add_(0, received[:k].to(torch.int64), received[k:] / self.ctx.world_size)
        flat.add_(self.memory)   # what compression held back is not lost


class GradientNoise(_SGD):
    info = OptimizerInfo("gradient-noise", "-", "Gaussian noise on each rank's gradient (Neelakantan et al. 2015), "
                         "seeded for reproducibility",
                         options={"seed": Option("the noise's seed", 1234, kind="int", minimum=0),
                                  "eta": Option("the noise's variance at step 0", 0.01, kind="float", minimum=0.0)})

    def __init__(self, ctx):
        super().__init__(ctx)
        torch.manual_seed(self.opts["seed"])
        self.count = 0

    def communicate(self, flat):
        std = (self.opts["eta"] / (1 + self.count) ** 0.55) ** 0.5
        flat.add_(torch.randn_like(flat), alpha=std)
        self.count += 1
        super().communicate(flat)


class UnseededNoise(GradientNoise):
    info = OptimizerInfo("unseeded-noise", "-", "Gaussian noise on each rank's gradient from torch's default "
                         "generator, which every rank seeds alike", options=GradientNoise.info.options)

    def __init__(self, ctx):
        _SGD.__init__(self, ctx)
        self.count = 0


class Departing(_SGD):
    info = OptimizerInfo("departing", "-", "a preempted rank leaves after `leave_after` steps and trains on alone; "
                         "its peers are not told",
                         options={"leave_after": Option("steps before rank `leaver` leaves", 20, kind="int",
                                                        minimum=0),
                                  "leaver": Option("the rank that is preempted", 1, kind="int", minimum=0)})

    def __init__(self, ctx):
        super().__init__(ctx)
        self.count = 0

    def communicate(self, flat):
        self.count += 1
        if self.ctx.rank == self.opts["leaver"] and self.count > self.opts["leave_after"]:
            self.leave()
            return
        super().communicate(flat)

    def leave(self):
        pass


class Frozen(Departing):
    info = OptimizerInfo("frozen", "-", "a preempted rank waits after `leave_after` steps to be admitted again; "
                         "nothing admits it", options=Departing.info.options)

    def __init__(self, ctx):
        super().__init__(ctx)
        self.admitted = threading.Event()

    def leave(self):
        self.admitted.wait()

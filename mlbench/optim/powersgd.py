"""PowerSGD: rank-r gradient compression by one step of power iteration, with error feedback.

Vogels, Karimireddy & Jaggi 2019, "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization" (NeurIPS; arXiv:1905.13727), Algorithms 1 and 2. Each gradient tensor
with two or more dimensions is viewed as an n x m matrix (first dimension x the rest) M, to which
the worker's error memory is added. With a shared m x r matrix Q:

    P = M Q           all-reduce-mean P      P^ = orthonormalise(P)  (Gram-Schmidt)
    Q = M^T P^        all-reduce-mean Q      the update is P^ Q^T, the error M - P^ Q^T

Because both products are linear in M, the k workers compute exactly one power-iteration step
on the mean gradient, and with r >= min(n, m) the approximation is exact. ``Q`` is kept from one
step to the next (warm start), so the iteration keeps improving on slowly changing gradients.
Vectors and biases are all-reduced uncompressed (in the same message as the P's). The averaged
approximation then goes through the task's SGD (momentum, Nesterov, weight decay), which is the
paper's Algorithm 2; each rank sends (n + m) r numbers per matrix instead of n m.
"""

from __future__ import annotations

import torch

from mlbench.optim.base import (
    DistributedOptimizer,
    OptimizerContext,
    all_reduce_mean_,
    allreduce_bytes,
    param_grads,
    local_sgd,
    set_lr,
)
from mlbench.optim.descriptors import INFO
from mlbench.optim.registry import register

#: Added to column norms in the orthonormalisation, so that a zero column stays finite.
ORTHO_EPS = 1e-8


def orthonormalise_(matrix: torch.Tensor) -> torch.Tensor:
    """Gram-Schmidt on the columns, in place (the paper's choice: cheap for small r)."""
    r = matrix.shape[1]
    for i in range(r):
        col = matrix[:, i:i + 1]
        col.div_(col.norm() + ORTHO_EPS)
        if i + 1 < r:
            rest = matrix[:, i + 1:]
            rest.sub_(col * (col.t() @ rest))
    return matrix


class PowerCompressor:
    """The state of PowerSGD for a list of parameters: Q per matrix, error memory per matrix."""

    def __init__(self, params: list[torch.nn.Parameter], rank: int, *, warm_start: bool = True,
                 error_feedback: bool = True, seed: int = 0):
        self.params = params
        self.warm_start = warm_start
        self.error_feedback = error_feedback
        # Every rank draws the same Q's from the same seed: P = M Q must use one Q everywhere.
        self.generator = torch.Generator().manual_seed(seed)
        self.matrices = [i for i, p in enumerate(params) if p.dim() >= 2]
        self.vectors = [i for i, p in enumerate(params) if p.dim() < 2]
        self.ranks: dict[int, int] = {}
        self.q: dict[int, torch.Tensor] = {}
        self.memory: dict[int, torch.Tensor] = {}
        for i in self.matrices:
            n, m = params[i].shape[0], params[i][0].numel()
            self.ranks[i] = min(rank, n, m)
            self.q[i] = self._random_q(m, self.ranks[i], params[i])
            self.memory[i] = torch.zeros(n, m, dtype=params[i].dtype, device=params[i].device)

    def _random_q(self, m: int, r: int, like: torch.Tensor) -> torch.Tensor:
        return torch.randn(m, r, generator=self.generator).to(device=like.device, dtype=like.dtype)

    @torch.no_grad()
    def reduce_(self, grads: list[torch.Tensor], world_size: int, group=None) -> int:
        """Replace ``grads`` by the averaged rank-r approximations; return the bytes sent."""
        mats: dict[int, torch.Tensor] = {}
        for i in self.matrices:
            g = grads[i].reshape(grads[i].shape[0], -1)
            mats[i] = g + self.memory[i] if self.error_feedback else g.clone()
            if not self.warm_start:
                self.q[i] = self._random_q(mats[i].shape[1], self.ranks[i], grads[i])
        # Message 1: every P, and the uncompressed vectors.
        ps = [mats[i] @ self.q[i] for i in self.matrices]
        first = torch.cat([p.reshape(-1) for p in ps] + [grads[i].reshape(-1) for i in self.vectors])
        all_reduce_mean_(first, world_size, group)
        sent = allreduce_bytes(first.numel(), first.element_size(), world_size)
        offset = 0
        p_hat: dict[int, torch.Tensor] = {}
        for i, p in zip(self.matrices, ps):
            p_hat[i] = orthonormalise_(first[offset:offset + p.numel()].view_as(p).clone())
            offset += p.numel()
        for i in self.vectors:
            grads[i].copy_(first[offset:offset + grads[i].numel()].view_as(grads[i]))
            offset += grads[i].numel()
        # Message 2: every Q = M^T P^.
        qs = [mats[i].t() @ p_hat[i] for i in self.matrices]
        if qs:
            second = torch.cat([q.reshape(-1) for q in qs])
            all_reduce_mean_(second, world_size, group)
            sent += allreduce_bytes(second.numel(), second.element_size(), world_size)
            offset = 0
            for i, q in zip(self.matrices, qs):
                self.q[i] = second[offset:offset + q.numel()].view_as(q).clone()
                offset += q.numel()
        for i in self.matrices:
            approx = p_hat[i] @ self.q[i].t()
            if self.error_feedback:
                self.memory[i] = mats[i] - approx
            grads[i].copy_(approx.view_as(grads[i]))
        return sent


@register
class PowerSGD(DistributedOptimizer):
    info = INFO["powersgd"]

    def __init__(self, ctx: OptimizerContext):
        super().__init__(ctx)
        self.compressor = PowerCompressor(self.params, self.opts["rank"],
                                          warm_start=self.opts["warm_start"],
                                          error_feedback=self.opts["error_feedback"])
        self.local = local_sgd(ctx, self.params)

    def step(self, lr: float) -> None:
        grads = param_grads(self.params)
        self.bytes_sent += self.compressor.reduce_(grads, self.ctx.world_size, self.ctx.group)
        self.ctx.timer.mark("communication")
        if self.grad_hook_allows_update():   # every rank holds the same decompressed average
            set_lr(self.local, lr)
            self.local.step()
        self.ctx.timer.mark("optimizer")

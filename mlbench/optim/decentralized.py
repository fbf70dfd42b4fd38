"""Decentralized SGD: a local step, then gossip averaging with the neighbours of a graph.

No rank is special and there is no global collective: each rank takes the task's SGD step on its
own gradient, then sends its weights to its neighbours and replaces them by the weighted average
x_i <- sum_j W_ij x_j of the mixing matrix W of the topology (see :mod:`mlbench.optim.topology`).
This is D-PSGD (Lian et al. 2017, "Can Decentralized Algorithms Outperform Centralized
Algorithms? A Case Study for Decentralized Parallel Stochastic Gradient Descent", NeurIPS) in the
"local step, then gossip" order analysed by Koloskova et al. 2020 ("A Unified Theory of
Decentralized SGD with Changing Topology and Local Updates", ICML). Each rank sends its whole
model once per neighbour per step: on a ring 2 models whatever k is, which is the method's
appeal on a large, slow network. Momentum buffers stay local.

The ranks' models differ between steps; evaluation uses their average (the quantity the theory
bounds) and gives each rank its own model back afterwards.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Callable

import torch
import torch.distributed as dist

from mlbench.optim.base import (
    ConsensusEvaluation,
    DistributedOptimizer,
    OptimizerContext,
    assign_flat_,
    flat_params,
    local_sgd,
    set_lr,
)
from mlbench.optim.descriptors import INFO
from mlbench.optim.registry import register
from mlbench.optim.topology import parse_topology


@torch.no_grad()
def gossip_(flat: torch.Tensor, self_weight: float, peers: list[tuple[int, float]],
            group: Any = None) -> int:
    """Replace ``flat`` by ``self_weight * flat + sum of weight * peer's flat`` over ``peers``
    (rank, weight); return the bytes sent. Every peer must call this with this rank as a peer."""
    if not peers:
        return 0
    # gloo's point-to-point transport takes host tensors only: stage a GPU vector through memory.
    staged = flat.cpu() if flat.is_cuda and dist.get_backend(group) == dist.Backend.GLOO else flat
    received = [torch.empty_like(staged) for _ in peers]
    requests = []
    for (peer, _), buf in zip(peers, received):
        requests.append(dist.isend(staged, _global(peer, group), group=group))
        requests.append(dist.irecv(buf, _global(peer, group), group=group))
    for request in requests:
        assert request is not None  # None only on a rank outside ``group``
        request.wait()
    mixed = staged * self_weight
    for (_, weight), buf in zip(peers, received):
        mixed.add_(buf, alpha=weight)
    flat.copy_(mixed)
    return len(peers) * flat.numel() * flat.element_size()


def _global(rank: int, group: Any) -> int:
    """isend/irecv take global ranks; the topology numbers the ranks of ``group``."""
    return rank if group is None else dist.get_global_rank(group, rank)


@register
class DecentralizedSGD(DistributedOptimizer):
    info = INFO["decentralized-sgd"]

    def __init__(self, ctx: OptimizerContext):
        super().__init__(ctx)
        self.topology = parse_topology(self.opts["topology"], ctx.world_size)
        rank = ctx.rank
        self.self_weight = self.topology.weight(rank, rank)
        self.peers = [(j, self.topology.weight(rank, j)) for j in self.topology.neighbours(rank)]
        self.local = local_sgd(ctx, self.params)
        self.consensus = ConsensusEvaluation(self.params, ctx.world_size, ctx.group)

    def step(self, lr: float) -> None:
        set_lr(self.local, lr)
        self.local.step()
        self.ctx.timer.mark("optimizer")
        flat = flat_params(self.params)
        self.bytes_sent += gossip_(flat, self.self_weight, self.peers, self.ctx.group)
        assign_flat_(self.params, flat)
        self.ctx.timer.mark("communication")

    def state_for_eval(self) -> Callable[[], None] | None:
        return self.consensus.enter()

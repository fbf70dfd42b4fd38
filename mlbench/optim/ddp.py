"""PyTorch DistributedDataParallel: the baseline a user would otherwise pick.

DDP (Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel Training",
VLDB, arXiv:2006.15704) groups the gradients into buckets and starts each bucket's all-reduce as
soon as the backward pass has produced it, so communication overlaps the rest of the backward
pass. The trainer forwards through the DDP wrapper (:attr:`module`); by the time ``backward()``
returns the gradients are averaged, and :meth:`step` only applies the task's SGD. Hence the
"communication" phase of a DDP run holds only the communication that did *not* overlap (none on
the CPU, where the backward waits for the last bucket): the rest is inside "backward".

Communication hooks (``hook=``) change what a bucket sends: ``fp16`` / ``bf16`` halve the bytes
(torch's ``fp16_compress_hook`` / ``bf16_compress_hook``); ``powersgd`` is torch's PowerSGD hook
(Vogels et al. 2019; vanilla all-reduce for the first ``start_iter`` steps, as torch requires); its
state is part of :meth:`DDP.state_dict`, so a resumed run continues exactly
(:mod:`mlbench.optim.ddp_powersgd`).
Bytes are counted from what each hook sends; DDP's broadcast of rank 0's buffers (BatchNorm
statistics) before each forward counts as (k-1)/k of the buffers per rank, the mean share of a
broadcast.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from mlbench.errors import UsageError
from mlbench.optim.base import (
    DistributedOptimizer,
    OptimizerContext,
    allreduce_bytes,
    local_sgd,
    set_lr,
)
from mlbench.optim.ddp_powersgd import ResumablePowerSGD
from mlbench.optim.descriptors import INFO
from mlbench.optim.registry import register

_HALF_HOOKS = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}


@register
class DDP(DistributedOptimizer):
    info = INFO["ddp"]

    def __init__(self, ctx: OptimizerContext):
        super().__init__(ctx)
        o = self.opts
        device = next(ctx.model.parameters()).device
        self.module = DistributedDataParallel(
            ctx.model, device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=o["bucket_mb"], process_group=ctx.group)
        # An attribute in every torch version (the constructor argument is deprecated in newer ones).
        self.module.broadcast_buffers = o["broadcast_buffers"]
        self.hook = o["hook"]
        self.powersgd: powerSGD_hook.PowerSGDState | None = None
        self.resumable: ResumablePowerSGD | None = None
        if self.hook in _HALF_HOOKS:
            self.module.register_comm_hook(ctx.group, _HALF_HOOKS[self.hook])
        elif self.hook == "powersgd":
            if device.type == "cpu" and torch.cuda.is_available():
                # torch's hook calls torch.cuda.synchronize(device) whenever a GPU is visible.
                raise UsageError("ddp hook=powersgd cannot run on the CPU of a machine with a GPU "
                                 "(a limitation of torch's hook); use --device cuda or --optimizer powersgd")
            self.powersgd = powerSGD_hook.PowerSGDState(
                process_group=ctx.group, matrix_approximation_rank=o["rank"],
                start_powerSGD_iter=o["start_iter"])
            self.resumable = ResumablePowerSGD(self.powersgd, list(ctx.model.parameters()))
            self.module.register_comm_hook(self.powersgd, self.resumable.hook)
        self.numel = sum(p.numel() for p in self.params)
        buffers = [b for b in ctx.model.buffers()]
        self.buffer_bytes = sum(b.numel() * b.element_size() for b in buffers) \
            if o["broadcast_buffers"] and ctx.world_size > 1 else 0
        self._compressed_seen = 0
        self.local = local_sgd(ctx, self.params)

    def _step_bytes(self) -> int:
        """Bytes this rank sent for the forward and backward that just ran."""
        world = self.ctx.world_size
        buffers = self.buffer_bytes * (world - 1) // world
        if self.hook in _HALF_HOOKS:
            return buffers + allreduce_bytes(self.numel, 2, world)
        if self.powersgd is not None:
            after = self.powersgd.total_numel_after_compression
            numel, self._compressed_seen = after - self._compressed_seen, after
            return buffers + allreduce_bytes(numel or self.numel, 4, world)
        return buffers + allreduce_bytes(self.numel, 4, world)

    def state_dict(self) -> dict[str, Any]:
        """The base state plus the PowerSGD hook's (which lives in torch's hook state, not here)."""
        state = {k: v for k, v in super().state_dict().items() if k not in ("powersgd", "resumable")}
        if self.resumable is not None:
            state["powersgd_hook"] = self.resumable.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        hook = state.pop("powersgd_hook", None)
        super().load_state_dict(state)
        if self.resumable is not None and hook is not None:
            self.resumable.load_state_dict(hook, next(self.ctx.model.parameters()).device)

    def step(self, lr: float) -> None:
        self.bytes_sent += self._step_bytes()
        self.ctx.timer.mark("communication")
        if self.grad_hook_allows_update():
            set_lr(self.local, lr)
            self.local.step()
        self.ctx.timer.mark("optimizer")

"""Centralized methods: every rank applies the same update, built from an all-reduce.

- ``centralized-sgd``, the reference of the closed division: each worker computes the gradient
  of its minibatch; the gradients are averaged with an all-reduce after every minibatch, and
  every worker applies the same SGD update (docs/tasks.md, task 1a "Algorithm"). No overlap with the
  backward pass: this is the reference that other methods are compared against.
- ``centralized-adam``: the same all-reduce, then Adam (Kingma & Ba 2015) instead of SGD, as
  the original MLBench's CentralizedAdam.
- ``centralized-adamw``: the same all-reduce, then AdamW (Loshchilov & Hutter 2019) with the
  task's weight decay on the matrices only, as llm.c and nanoGPT train GPT-2 (task 5a).
- ``model-averaging``: each worker takes a local SGD step and then the weights are averaged
  (the original's ``agg_grad=False``); with ``period=H`` every H steps, which is local SGD
  (Stich 2019, "Local SGD converges fast and communicates little"; Lin et al. 2020, "Don't use
  large mini-batches, use local SGD"). Without momentum and with H=1 it is exactly centralized
  SGD, since averaging is linear.

``by=model`` packs all tensors into one flat buffer and does one collective; ``by=layer`` does
one collective per tensor (the original's two modes): the same numbers, a different count of
messages, which is what a latency-bound network feels.
"""

from __future__ import annotations

from typing import Any, cast
from collections.abc import Callable

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from mlbench.optim.base import (
    ConsensusEvaluation,
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

def average_tensors(tensors: list[torch.Tensor], world_size: int, by: str, group: Any = None) -> int:
    """All-reduce-average the tensors in place; returns the bytes this rank sent.

    One worker has nothing to average: no packing into a flat buffer, no copies back.
    """
    if world_size == 1:
        return 0
    if by == "model":
        flat = _flatten_dense_tensors(tensors)
        all_reduce_mean_(flat, world_size, group)
        for t, synced in zip(tensors, _unflatten_dense_tensors(flat, tensors)):
            t.copy_(synced)
        return allreduce_bytes(flat.numel(), flat.element_size(), world_size)
    sent = 0
    for t in tensors:
        all_reduce_mean_(t, world_size, group)
        sent += allreduce_bytes(t.numel(), t.element_size(), world_size)
    return sent


def average_gradients(params: list[torch.nn.Parameter], world_size: int, by: str, group: Any = None) -> int:
    """All-reduce-average the gradients in place; returns the bytes this rank sent."""
    return average_tensors(param_grads(params), world_size, by, group)


def sgd_update_(params: list[torch.Tensor], grads: list[torch.Tensor], bufs: list[torch.Tensor],
                lr: float | torch.Tensor, *, momentum: float, nesterov: bool, weight_decay: float) -> None:
    """torch.optim.SGD's step (dampening 0), in place, with foreach kernels.

    ``bufs`` start at zero, which makes the first step's buffer equal to the gradient exactly as
    torch.optim.SGD's clone does. ``grads`` are overwritten. ``lr`` is a float in eager mode (the
    update is then torch's own ``p.add_(g, alpha=-lr)``) or a 0-d tensor that a captured CUDA
    graph reads at every replay.
    """
    if weight_decay:
        torch._foreach_add_(grads, params, alpha=weight_decay)
    if momentum:
        torch._foreach_mul_(bufs, momentum)
        torch._foreach_add_(bufs, grads)
        if nesterov:
            torch._foreach_add_(grads, bufs, alpha=momentum)
        else:
            torch._foreach_copy_(grads, bufs)
    if isinstance(lr, torch.Tensor):
        torch._foreach_mul_(grads, lr)
        torch._foreach_sub_(params, grads)
    else:
        torch._foreach_add_(params, grads, alpha=-lr)


@register
class CentralizedSGD(DistributedOptimizer):
    """The reference step, eager or captured whole in a CUDA graph.

    Gradients live in persistent tensors (zeroed in place), the all-reduce is
    :func:`average_gradients` and the update :func:`sgd_update_`, so the same code runs eagerly
    and inside a graph. On a GPU, :meth:`make_step` captures the task's gradient computation, the
    all-reduce and the update once and replays them every step (the learning rate is a device
    tensor written before each replay): at batch 32 a ResNet-20 step is a few hundred small
    kernels, and launching them one by one from Python costs more than running them.
    """

    info = INFO["centralized-sgd"]

    def __init__(self, ctx: OptimizerContext):
        super().__init__(ctx)
        self.by = self.opts["by"]
        for p in self.params:
            p.grad = torch.zeros_like(p)
        self.grads = param_grads(self.params)
        self.bufs = [torch.zeros_like(p) for p in self.params]
        self.lr_tensor = torch.zeros((), device=self.params[0].device) if self.params else None
        self.graph: torch.cuda.CUDAGraph | None = None

    def zero_grad(self) -> None:
        torch._foreach_zero_(self.grads)

    @torch.no_grad()
    def step(self, lr: float | torch.Tensor) -> None:
        self.bytes_sent += average_gradients(self.params, self.ctx.world_size, self.by, self.ctx.group)
        self.ctx.timer.mark("communication")
        if self.grad_hook_allows_update():
            params = cast("list[torch.Tensor]", self.params)  # Parameters are Tensors; lists are invariant
            hyper = self.ctx.hyper
            sgd_update_(params, self.grads, self.bufs, lr, momentum=hyper.momentum, nesterov=hyper.nesterov,
                        weight_decay=hyper.weight_decay)
        self.ctx.timer.mark("optimizer")

    def make_step(self, gradients: Callable[[torch.Tensor], torch.Tensor], *,
                  capture: torch.Tensor | None = None,
                  state: Callable[[], dict[str, torch.Tensor]] | None = None,
                  ) -> Callable[[torch.Tensor, float], torch.Tensor]:
        """The whole training step: ``gradients(batch)`` (the task's data, forward and backward
        passes), then the all-reduce and the update.

        ``capture``: a static batch tensor (e.g. the index vector of a minibatch); when given,
        the step is captured in a CUDA graph that reads its batch from that tensor. ``state``
        returns the tensors (the model's state dict) that the capture's warm-up steps change and
        that are restored after it.
        """
        if capture is None:
            def eager(batch: torch.Tensor, lr: float) -> torch.Tensor:
                self.ctx.timer.begin()
                self.zero_grad()
                loss = gradients(batch)
                self.step(lr)
                return loss
            return eager
        static_loss = self._capture(gradients, capture, state)
        bytes_per_step = self._bytes_per_step()

        def replay(batch: torch.Tensor, lr: float) -> torch.Tensor:
            assert self.graph is not None and self.lr_tensor is not None
            self.bytes_sent += bytes_per_step
            self.lr_tensor.fill_(lr)
            capture.copy_(batch, non_blocking=True)
            self.graph.replay()
            self.ctx.timer.replayed()
            return static_loss
        return replay

    def _bytes_per_step(self) -> int:
        if self.by == "model":
            return allreduce_bytes(sum(p.numel() for p in self.params), 4, self.ctx.world_size)
        return sum(allreduce_bytes(p.numel(), 4, self.ctx.world_size) for p in self.params)

    def _capture(self, gradients: Callable[[torch.Tensor], torch.Tensor], static_batch: torch.Tensor,
                 state: Callable[[], dict[str, torch.Tensor]] | None) -> torch.Tensor:
        """Warm up on a side stream with lr = 0, capture one step, then put back every state the
        warm-up and the capture changed: the model's, the momentum buffers' and the GPU's random
        generator's. A run that resumes from a checkpoint captures its step after loading it, so
        what it loaded must survive the capture (momentum zeroed here made a resumed GPU run lose
        its momentum), and its random stream must go on from the checkpoint's, not from three
        warm-up steps later (the random crops of task 1a's next batches)."""
        lr_tensor = self.lr_tensor
        assert lr_tensor is not None
        tensors = [*(state().values() if state is not None else (p.data for p in self.params)), *self.bufs]
        saved = [t.detach().clone() for t in tensors]
        device = lr_tensor.device
        random_state = torch.cuda.get_rng_state(device)
        lr_tensor.zero_()
        timer = self.ctx.timer
        timing, timer.enabled = timer.enabled, False

        def body() -> torch.Tensor:
            self.zero_grad()
            loss = gradients(static_batch)
            sent = self.bytes_sent
            self.step(lr_tensor)
            self.bytes_sent = sent  # counted per replay, not per capture
            return loss

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                body()
        torch.cuda.current_stream().wait_stream(side)
        timer.enabled = timing
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            timer.capture(True)
            static_loss = body()
            timer.capture(False)
        with torch.no_grad():
            for t, s in zip(tensors, saved):
                t.copy_(s)
        torch.cuda.set_rng_state(random_state, device)
        return static_loss


def adam_update(params: list[torch.nn.Parameter], o: dict[str, Any], decay: float) -> torch.optim.Adam:
    """centralized-adam's step after the all-reduce (options ``o``: betas, eps): Adam with the
    task's weight decay coupled to the gradient (``fsdp`` applies it to its shards too)."""
    return torch.optim.Adam(params, lr=0.0, betas=(o["beta1"], o["beta2"]), eps=o["eps"], weight_decay=decay)


def adamw_update(params: list[torch.nn.Parameter], o: dict[str, Any], decay: float) -> torch.optim.AdamW:
    """centralized-adamw's step after the all-reduce (options ``o``: betas, eps, ``decay``
    matrices or all): AdamW with the task's weight decay decoupled, on the tensors of two or more
    dimensions unless ``decay`` is all (``fsdp`` applies it to its shards too)."""
    decayed = [p for p in params if o["decay"] == "all" or p.dim() >= 2]
    kept = [p for p in params if not (o["decay"] == "all" or p.dim() >= 2)]
    groups = [{"params": decayed, "weight_decay": decay}] + ([{"params": kept, "weight_decay": 0.0}]
                                                             if kept else [])
    return torch.optim.AdamW(groups, lr=0.0, betas=(o["beta1"], o["beta2"]), eps=o["eps"])


@register
class CentralizedAdam(DistributedOptimizer):
    info = INFO["centralized-adam"]

    def __init__(self, ctx: OptimizerContext):
        super().__init__(ctx)
        # A task whose reference optimizer is Adam (4b) or AdamW (5a) states its own values in
        # its settings; they replace the defaults, not what the user set.
        task_values = {k: v for k, v in ctx.hyper.reference_options().items()
                       if k not in ctx.options and k in self.opts}
        o = self.opts = {**self.opts, **task_values}
        self.by = o["by"]
        self.local = self._update(o, ctx.hyper.weight_decay)

    def _update(self, o: dict[str, Any], decay: float) -> torch.optim.Optimizer:
        return adam_update(self.params, o, decay)

    def step(self, lr: float) -> None:
        self.bytes_sent += average_gradients(self.params, self.ctx.world_size, self.by, self.ctx.group)
        self.ctx.timer.mark("communication")
        if self.grad_hook_allows_update():
            set_lr(self.local, lr * self.ctx.hyper.rate_factor(self.opts))
            self.local.step()
        self.ctx.timer.mark("optimizer")


@register
class CentralizedAdamW(CentralizedAdam):
    """All-reduced gradients, then AdamW with the task's weight decay decoupled (Loshchilov &
    Hutter 2019), on the matrices only by default: biases, LayerNorms and other vectors are not
    decayed, as llm.c's and nanoGPT's GPT-2 recipes have it (task 5a)."""

    info = INFO["centralized-adamw"]

    def _update(self, o: dict[str, Any], decay: float) -> torch.optim.Optimizer:
        return adamw_update(self.params, o, decay)


@register
class ModelAveraging(DistributedOptimizer):
    info = INFO["model-averaging"]

    def __init__(self, ctx: OptimizerContext):
        super().__init__(ctx)
        self.by = self.opts["by"]
        self.period = self.opts["period"]
        self.local = local_sgd(ctx, self.params)
        self.since_average = 0
        self.consensus = ConsensusEvaluation(self.params, ctx.world_size, ctx.group)

    def step(self, lr: float) -> None:
        if self.grad_hook_allows_update():   # on this rank's own gradient (a local update)
            set_lr(self.local, lr)
            self.local.step()
        self.ctx.timer.mark("optimizer")
        self.since_average += 1
        if self.since_average == self.period:
            with torch.no_grad():
                self.bytes_sent += average_tensors([p.data for p in self.params], self.ctx.world_size,
                                                   self.by, self.ctx.group)
            self.since_average = 0
        self.ctx.timer.mark("communication")

    def state_for_eval(self) -> Callable[[], None] | None:
        return self.consensus.enter() if self.since_average else None

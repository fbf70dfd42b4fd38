"""The DiLoCo family: local inner steps, then a synchronisation of what the workers moved.

Each worker keeps a copy of the *global* model (the one every worker agrees on) and trains its
own model for ``H`` inner steps on its data (AdamW by default, its state kept across rounds).
The pseudo-gradient is the global model minus the worker's own; an outer step on the workers'
average of it moves the global model, and every worker goes on from there.

- ``diloco`` (Douillard et al. 2023, arXiv:2311.08105, Algorithm 1): one all-reduce of the whole
  pseudo-gradient per round; the outer step is SGD with Nesterov momentum (the paper's lr 0.7,
  momentum 0.9).
- ``streaming-diloco`` (Douillard et al. 2025, arXiv:2501.18512): the model is cut into
  ``fragments`` fragments (equal pieces of the flattened model, or the paper's strided pattern of
  tensors); fragment p is synchronised every ``H`` steps, at offset
  (p+1) H/fragments, so that one fragment's bytes are in flight at a time. Its all-reduce runs in
  the background for ``overlap`` inner steps (tau) while the worker trains on; when it lands, the
  fragment's global part takes its outer step and the worker's part becomes
  ``(1 - alpha) global + alpha own`` (the paper's merge). The pseudo-gradients can travel in 16
  bits (``outer_dtype``); the outer step is in fp32.
- ``sparseloco`` (Sarfi et al. 2025, arXiv:2508.15706): each worker adds its pseudo-gradient to an
  error-feedback memory decayed by beta, sends the memory's largest ``density`` share of entries
  in each chunk of ``chunk`` entries (an all-gather of values and indices) and keeps the rest;
  the global model moves by ``outer_lr`` times the average of the sparse updates. The error
  feedback stands in for the outer momentum. The paper also quantises the values to 2 bits:
  here they travel in fp32.

What these methods deploy is the global model, so evaluation scores it (``state_for_eval``):
the workers' own models are put aside and given back afterwards. Floating-point buffers (batch
norm's running statistics) have no pseudo-gradient: they are averaged at each synchronisation
(with the last fragment for ``streaming-diloco``), and the global model carries the averaged ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from mlbench.errors import UsageError
from mlbench.optim.base import (
    DistributedOptimizer,
    OptimizerContext,
    all_gather,
    allgather_bytes,
    allreduce_bytes,
    local_sgd,
    set_lr,
)
from mlbench.optim.centralized import average_tensors
from mlbench.optim.descriptors import INFO
from mlbench.optim.registry import register

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class GlobalModel:
    """The parameters and floating-point buffers every worker agrees on: what the method deploys."""

    def __init__(self, params: list[torch.nn.Parameter], buffers: list[torch.Tensor]):
        # (not "params": mlbench.optim.state never saves an attribute of that name)
        self.weights = [p.detach().clone() for p in params]
        self.buffers = [b.detach().clone() for b in buffers]

    @torch.no_grad()
    def swap_in(self, params: list[torch.nn.Parameter], buffers: list[torch.Tensor]) -> Callable[[], None]:
        """Put the global model into ``params``/``buffers``; return what gives the worker's own back."""
        own = [t.detach().clone() for t in (*params, *buffers)]
        for t, value in zip((*params, *buffers), (*self.weights, *self.buffers)):
            t.data.copy_(value)

        def restore() -> None:
            with torch.no_grad():
                for t, value in zip((*params, *buffers), own):
                    t.data.copy_(value)
        return restore


def nesterov_outer_(global_: list[torch.Tensor], delta: list[torch.Tensor], momentum: list[torch.Tensor],
                    lr: float, mu: float) -> None:
    """DiLoCo's outer step: torch.optim.SGD(nesterov=True, dampening 0) on the pseudo-gradient,
    in place (``delta`` is overwritten)."""
    if mu:
        torch._foreach_mul_(momentum, mu)
        torch._foreach_add_(momentum, delta)
        torch._foreach_add_(delta, momentum, alpha=mu)
    torch._foreach_add_(global_, delta, alpha=-lr)


class _LocalSteps(DistributedOptimizer):
    """What the family shares: the inner optimizer, the global model, the step counter, and the
    evaluation of the global model."""

    def __init__(self, ctx: OptimizerContext):
        super().__init__(ctx)
        o = self.opts
        if o["inner"] == "adamw":
            self.inner: torch.optim.Optimizer = torch.optim.AdamW(
                self.params, lr=0.0, weight_decay=o["inner_weight_decay"])
        else:
            self.inner = local_sgd(ctx, self.params)
        self.buffers = [b for b in ctx.model.buffers() if b.is_floating_point()]
        self.global_model = GlobalModel(self.params, self.buffers)
        self.local_step = 0

    def step(self, lr: float) -> None:
        if self.grad_hook_allows_update():
            set_lr(self.inner, lr * self.inner_rate_factor())
            self.inner.step()
        self.ctx.timer.mark("optimizer")
        self.local_step += 1
        self.synchronise()
        self.ctx.timer.mark("communication")

    def inner_rate_factor(self) -> float:
        """The inner step's rate over the task's: AdamW's ``inner_lr`` (absolute) or
        ``inner_lr_scale``; the task's own SGD takes the task's rate as is."""
        if self.opts["inner"] != "adamw":
            return 1.0
        return self.ctx.hyper.rate_factor(self.opts, lr="inner_lr", scale="inner_lr_scale")

    def synchronise(self) -> None:
        """What follows the inner step ``self.local_step``: a round's synchronisation, when due."""
        raise NotImplementedError

    def pseudo_gradient(self) -> list[torch.Tensor]:
        """The global model minus this worker's, tensor by tensor."""
        return [g - p.detach() for g, p in zip(self.global_model.weights, self.params)]

    @torch.no_grad()
    def average_buffers(self) -> None:
        """Every worker's buffers (and the global model's) become their average."""
        if not self.buffers:
            return
        self.bytes_sent += average_tensors([b.data for b in self.buffers], self.ctx.world_size, "model",
                                           self.ctx.group)
        for b, g in zip(self.buffers, self.global_model.buffers):
            g.copy_(b)

    def state_for_eval(self) -> Callable[[], None] | None:
        return self.global_model.swap_in(self.params, self.buffers)


@register
class DiLoCo(_LocalSteps):
    """One all-reduce of the pseudo-gradient every H steps, then Nesterov SGD on the global model."""

    info = INFO["diloco"]

    def __init__(self, ctx: OptimizerContext):
        super().__init__(ctx)
        self.outer_momentum = [torch.zeros_like(p) for p in self.global_model.weights]

    @torch.no_grad()
    def synchronise(self) -> None:
        if self.local_step % self.opts["H"]:
            return
        delta = self.pseudo_gradient()
        self.bytes_sent += average_tensors(delta, self.ctx.world_size, "model", self.ctx.group)
        nesterov_outer_(self.global_model.weights, delta, self.outer_momentum, self.opts["outer_lr"],
                        self.opts["outer_momentum"])
        for p, g in zip(self.params, self.global_model.weights):
            p.data.copy_(g)
        self.average_buffers()

    def state_for_eval(self) -> Callable[[], None] | None:
        return super().state_for_eval() if self.local_step % self.opts["H"] else None


#: One piece of a fragment: parameter tensor ``i``'s flattened entries ``start:stop``.
Piece = tuple[int, int, int]


def fragment_pieces(sizes: list[int], fragments: int, pattern: str) -> list[list[Piece]]:
    """The model's fragments: ``strided`` deals tensor i to fragment i mod ``fragments`` (the
    paper's pattern of layers); ``sequential`` cuts the flattened model into ``fragments``
    contiguous pieces of equal size (a tensor may straddle two)."""
    if pattern == "strided":
        if fragments > len(sizes):
            raise UsageError(f"optimizer streaming-diloco: fragments={fragments} with pattern=strided, but the "
                             f"model has {len(sizes)} parameter tensors; use pattern=sequential or fewer fragments",
                             option="optimizer_options.fragments")
        return [[(i, 0, sizes[i]) for i in range(f, len(sizes), fragments)] for f in range(fragments)]
    total = sum(sizes)
    if fragments > total:
        raise UsageError(f"optimizer streaming-diloco: fragments={fragments} but the model has {total} parameters",
                         option="optimizer_options.fragments")
    bounds = [total * f // fragments for f in range(fragments + 1)]
    pieces: list[list[Piece]] = [[] for _ in range(fragments)]
    offset = 0
    for i, size in enumerate(sizes):
        for f in range(fragments):
            start, stop = max(bounds[f], offset), min(bounds[f + 1], offset + size)
            if start < stop:
                pieces[f].append((i, start - offset, stop - offset))
        offset += size
    return pieces


@register
class StreamingDiLoCo(_LocalSteps):
    """Fragments synchronised in turn, each all-reduce overlapped with ``overlap`` inner steps."""

    info = INFO["streaming-diloco"]

    def __init__(self, ctx: OptimizerContext):
        super().__init__(ctx)
        o = self.opts
        self.fragments = fragment_pieces([p.numel() for p in self.params], o["fragments"], o["pattern"])
        self.every = o["H"] // o["fragments"]
        self.dtype = _DTYPES[o["outer_dtype"]]
        self.outer_momentum = [torch.zeros_like(p) for p in self.global_model.weights]
        # the fragment whose all-reduce is in flight, the step it lands at, and its sum
        self.pending_fragment: int | None = None
        self.pending_due = 0
        self.pending_sum: torch.Tensor | None = None
        self._work: Any = None

    @torch.no_grad()
    def synchronise(self) -> None:
        if self.pending_fragment is not None and self.local_step == self.pending_due:
            self._land()
        if self.local_step % self.every == 0:
            fragment = (self.local_step // self.every - 1) % len(self.fragments)
            self._send(fragment)
            if self.opts["overlap"] == 0:
                self._land()

    def _views(self, tensors: Sequence[torch.Tensor], fragment: int) -> list[torch.Tensor]:
        """The fragment's pieces of ``tensors`` (one per parameter tensor), as views."""
        return [tensors[i].detach().view(-1)[start:stop] for i, start, stop in self.fragments[fragment]]

    def _send(self, fragment: int) -> None:
        own = self._views(self.params, fragment)
        global_ = self._views(self.global_model.weights, fragment)
        flat = torch.cat([g - p for g, p in zip(global_, own)]).to(self.dtype)
        if self.ctx.world_size > 1:
            self._work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.ctx.group, async_op=True)
        self.bytes_sent += allreduce_bytes(flat.numel(), flat.element_size(), self.ctx.world_size)
        self.pending_fragment, self.pending_sum = fragment, flat
        self.pending_due = self.local_step + self.opts["overlap"]

    def _wait(self) -> None:
        if self._work is not None:
            self._work.wait()
            self._work = None

    def _land(self) -> None:
        """The pending fragment's outer step, then the merge of the worker's part with it."""
        self._wait()
        assert self.pending_fragment is not None and self.pending_sum is not None
        fragment = self.pending_fragment
        own = self._views(self.params, fragment)
        global_ = self._views(self.global_model.weights, fragment)
        mean = self.pending_sum.to(torch.float32).div_(self.ctx.world_size)
        delta = list(mean.split([v.numel() for v in own]))
        nesterov_outer_(global_, delta, self._views(self.outer_momentum, fragment), self.opts["outer_lr"],
                        self.opts["outer_momentum"])
        alpha = self.opts["alpha"]
        for p, g in zip(own, global_):
            p.copy_(torch.lerp(g, p, alpha) if alpha else g)
        if fragment == len(self.fragments) - 1:
            self.average_buffers()
        self.pending_fragment, self.pending_sum = None, None

    def state_for_eval(self) -> Callable[[], None] | None:
        self._wait()   # an all-reduce in flight completes first: evaluation's own collectives follow it
        return super().state_for_eval()

    def state_dict(self) -> dict[str, Any]:
        self._wait()   # a checkpoint holds the finished sum of a fragment in flight, not a half-reduced one
        return super().state_dict()


def chunk_top_k(values: torch.Tensor, density: float, chunk: int) -> torch.Tensor:
    """Indices of the largest-magnitude ``density`` share of every chunk of ``chunk`` consecutive
    entries (at least one per chunk; the last, shorter chunk keeps its own share), ascending
    within each chunk's choice by magnitude, as ``torch.topk`` returns them."""
    n = values.numel()
    size = min(chunk, n)
    full = n // size
    k = max(1, round(density * size))
    chosen = []
    if full:
        rows = values[:full * size].abs().view(full, size)
        top = rows.topk(k, dim=1, sorted=True).indices
        chosen.append((top + torch.arange(full).unsqueeze(1) * size).reshape(-1))
    rest = n - full * size
    if rest:
        tail = values[full * size:].abs()
        chosen.append(tail.topk(max(1, round(density * rest)), sorted=True).indices + full * size)
    return torch.cat(chosen)


@register
class SparseLoCo(_LocalSteps):
    """Error feedback and a top-k per chunk on the pseudo-gradient; an all-gather of the sparse updates."""

    info = INFO["sparseloco"]

    def __init__(self, ctx: OptimizerContext):
        super().__init__(ctx)
        self.error = torch.zeros(sum(p.numel() for p in self.params), device=self.params[0].device) \
            if self.params else torch.zeros(0)

    @torch.no_grad()
    def synchronise(self) -> None:
        if self.local_step % self.opts["H"]:
            return
        o, k = self.opts, self.ctx.world_size
        delta = _flatten_dense_tensors(self.pseudo_gradient())
        self.error.mul_(o["ef_decay"]).add_(delta)
        indices = chunk_top_k(self.error, o["density"], o["chunk"])
        sent = self.error[indices]
        self.error[indices] = 0.0
        message = torch.cat([indices.to(torch.int32), sent.view(torch.int32)])
        everyone = all_gather(message, k, self.ctx.group)
        self.bytes_sent += allgather_bytes(message.numel() * message.element_size(), k)
        total = torch.zeros_like(self.error)
        half = indices.numel()
        for received in everyone:
            total.index_add_(0, received[:half].to(torch.int64), received[half:].view(torch.float32))
        total.div_(k)
        global_flat = _flatten_dense_tensors(self.global_model.weights)
        global_flat.sub_(total, alpha=o["outer_lr"])
        for p, g, value in zip(self.params, self.global_model.weights,
                               _unflatten_dense_tensors(global_flat, self.global_model.weights)):
            g.copy_(value)
            p.data.copy_(value)
        self.average_buffers()

    def state_for_eval(self) -> Callable[[], None] | None:
        return super().state_for_eval() if self.local_step % self.opts["H"] else None

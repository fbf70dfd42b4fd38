"""Fast training steps for the reference algorithm (synchronous SGD with gradient all-reduce).

The closed division fixes the algorithm, not the implementation. Two things make the reference
step fast without changing what it computes:

* **Closed-form logistic regression** (task 2a): the gradient of the mean logistic loss is
  ``X^T s / n`` with ``s = -y * sigmoid(-y z)``, so the step needs two matrix-vector products
  and no autograd graph.
* **Whole-step CUDA graphs** (GPU): batch gather, augmentation, forward, loss, backward, the NCCL
  all-reduce and the SGD update are captured once and replayed every step; the learning rate is
  a device tensor written before each replay. At batch 32 a ResNet-20 step is a few hundred
  small kernels: launching them one by one from Python costs more than running them.

Both paths share :func:`sgd_update_`, torch.optim.SGD's update (momentum, Nesterov, weight
decay, first-step buffer = gradient) written with foreach kernels and a tensor learning rate.
Tests check both against the eager reference (autograd + torch.optim.SGD).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from mlbench.optim.base import allreduce_bytes
from mlbench.tasks.losses import batch_loss, regulariser
from mlbench.tasks.pipeline import Pipeline
from mlbench.tasks.spec import TaskSpec
from mlbench.worker.timing import PhaseTimer


def sgd_update_(params: list[torch.Tensor], grads: list[torch.Tensor], bufs: list[torch.Tensor],
                lr: torch.Tensor, *, momentum: float, nesterov: bool, weight_decay: float) -> None:
    """torch.optim.SGD's step (dampening 0), in place, with ``lr`` a 0-d tensor.

    ``bufs`` start at zero, which makes the first step's buffer equal to the gradient exactly as
    torch.optim.SGD's clone does. ``grads`` are overwritten.
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
    torch._foreach_mul_(grads, lr)
    torch._foreach_sub_(params, grads)


def logistic_gradients_(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, l2: float) -> torch.Tensor:
    """Closed-form gradient of mean log(1 + exp(-y z)) + l2/2 |w|^2 into p.grad; returns the loss."""
    linear = model.linear
    w, b = linear.weight, linear.bias
    z = x @ w[0] if b is None else torch.addmv(b.expand(x.shape[0]), x, w[0])
    margin = -y * z
    s = -y * torch.sigmoid(margin) / x.shape[0]
    w.grad.copy_((s @ x).unsqueeze(0))
    if l2:
        w.grad.add_(w, alpha=l2)
    if b is not None:
        b.grad.copy_(s.sum().unsqueeze(0))
    return torch.nn.functional.softplus(margin).mean() + 0.5 * l2 * (w * w).sum()


class ReferenceStep:
    """One synchronous SGD step with flat-buffer all-reduce, eager or captured in a CUDA graph."""

    def __init__(self, model: torch.nn.Module, spec: TaskSpec, data: Pipeline, timer: PhaseTimer,
                 world_size: int, *, capture: bool, precision: str = "fp32"):
        self.model = model
        self.spec = spec
        self.data = data
        self.timer = timer
        self.world = world_size
        self.params = [p for p in model.parameters() if p.requires_grad]
        for p in self.params:
            p.grad = torch.zeros_like(p)
        self.grads = [p.grad for p in self.params]
        self.bufs = [torch.zeros_like(p) for p in self.params]
        device = self.params[0].device
        self.lr = torch.zeros((), device=device)
        self.numel = sum(p.numel() for p in self.params)
        self.bytes_per_step = allreduce_bytes(self.numel, 4, world_size)
        self.autocast = precision == "bf16"
        self.closed_form = spec.loss == "logistic" and hasattr(model, "linear")
        self.bytes_sent = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        if capture:
            self._capture(device)

    # -- the step body (what a graph captures) ---------------------------------------------------
    def _gradients(self, idx: torch.Tensor) -> torch.Tensor:
        x, y = self.data.train_batch(idx)
        self.timer.mark("data")
        if self.closed_form:
            loss = logistic_gradients_(self.model, x, y, self.spec.l2)
            self.timer.mark("forward")
            self.timer.mark("backward")
            return loss
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            output = self.model(x)
            loss = batch_loss(self.spec.loss, output, y)
        objective = loss + regulariser(self.model, self.spec.l2)
        self.timer.mark("forward")
        torch._foreach_zero_(self.grads)
        objective.backward()
        self.timer.mark("backward")
        return objective.detach()

    @torch.no_grad()
    def _communicate_and_update(self) -> None:
        if self.world > 1:
            flat = torch.cat([g.reshape(-1) for g in self.grads])
            dist.all_reduce(flat)
            flat.div_(self.world)
            torch._foreach_copy_(self.grads, [v.view_as(g) for v, g in
                                               zip(flat.split([g.numel() for g in self.grads]), self.grads)])
        self.timer.mark("communication")
        sgd_update_(self.params, self.grads, self.bufs, self.lr, momentum=self.spec.momentum,
                    nesterov=self.spec.nesterov, weight_decay=self.spec.weight_decay)
        self.timer.mark("optimizer")

    def _body(self, idx: torch.Tensor) -> torch.Tensor:
        loss = self._gradients(idx)
        self._communicate_and_update()
        return loss

    # -- CUDA graph ---------------------------------------------------------------------------
    def _capture(self, device: torch.device) -> None:
        """Warm up on a side stream with lr = 0, restore every state, then capture one step."""
        self.static_idx = torch.zeros(self.spec.batch_per_worker, dtype=torch.long, device=device)
        saved = [t.detach().clone() for t in self.model.state_dict().values()]
        self.lr.zero_()
        timing, self.timer.enabled = self.timer.enabled, False
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self._body(self.static_idx)
        torch.cuda.current_stream().wait_stream(side)
        self.timer.enabled = timing
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.timer.capture(True)
            self.static_loss = self._body(self.static_idx)
            self.timer.capture(False)
        with torch.no_grad():
            for t, s in zip(self.model.state_dict().values(), saved):
                t.copy_(s)
            for buf in self.bufs:
                buf.zero_()

    def state_for_eval(self) -> None:
        """All ranks hold the same parameters after every step: nothing to do."""

    def __call__(self, idx: torch.Tensor, lr: float) -> torch.Tensor:
        self.bytes_sent += self.bytes_per_step
        self.lr.fill_(lr)
        if self.graph is not None:
            self.static_idx.copy_(idx, non_blocking=True)
            self.graph.replay()
            self.timer.replayed()
            return self.static_loss
        self.timer.begin()
        with torch.no_grad() if self.closed_form else torch.enable_grad():
            return self._body(idx)

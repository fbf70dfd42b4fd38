"""What a task tells its optimizer, as numbers: the optimizer layer knows no task.

An optimizer reads the task's SGD hyper-parameters (momentum, Nesterov, weight decay), the name
of the task's reference optimizer (``fsdp`` applies that update to its shards) and, where that
reference is Adam or AdamW, the task's betas, eps and rate scale; the rate of each step arrives
through ``step(lr)``. The worker builds a :class:`Hyper` from the task (torchtitan's trainer
hands its optimizers a config, not the model's spec); ``mlbench check-optimizer`` builds one for
its test bed. Torch-free.

The rate: ``step(lr)`` passes the task's schedule at that step. An optimizer whose natural rate
differs from SGD's (Adam, sign steps) scales it (``lr_scale``: the schedule's shape and size,
times the scale), or takes an absolute peak rate (``--opt lr=``): the schedule's shape with that
peak, ``lr x rate / peak_lr``, the same number on every task whatever the task's own rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlbench.errors import UsageError
from mlbench.optim.descriptors import REFERENCE_OPTIMIZER


@dataclass(frozen=True)
class Hyper:
    """The task's hyper-parameters that optimizers read.

    ``peak_lr``: the peak of the task's schedule at this worker count (the rate after warm-up,
    or at the first step of a decaying one), which ``--opt lr=`` replaces. ``reference``: the
    task's reference optimizer. ``betas``, ``eps``, ``lr_scale``: the task's values of Adam's
    options where its reference is Adam or AdamW (task 4b, 5a; None: the optimizer's defaults),
    which replace those optimizers' defaults, not what the user set.
    """

    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    peak_lr: float = 1.0
    reference: str = REFERENCE_OPTIMIZER
    betas: tuple[float, float] | None = None
    eps: float | None = None
    lr_scale: float | None = None

    def reference_options(self) -> dict[str, float]:
        """The task's Adam values as the options of ``centralized-adam``/``-adamw`` name them."""
        out: dict[str, float] = {}
        if self.betas is not None:
            out["beta1"], out["beta2"] = self.betas
        if self.eps is not None:
            out["eps"] = self.eps
        if self.lr_scale is not None:
            out["lr_scale"] = self.lr_scale
        return out

    def rate_factor(self, opts: dict[str, Any], lr: str = "lr", scale: str = "lr_scale") -> float:
        """What the schedule's rate is multiplied by, from the parsed options ``opts``: the
        absolute peak ``opts[lr]`` over :attr:`peak_lr` when it is set, else ``opts[scale]``."""
        absolute = opts.get(lr)
        if absolute is None:
            return float(opts[scale])
        if not self.peak_lr > 0:
            raise UsageError(f"option {lr}={absolute:g} replaces the peak of the task's rate, and this task's "
                             f"rate has none (peak {self.peak_lr:g}); use {scale} instead",
                             option=f"optimizer_options.{lr}")
        return float(absolute) / self.peak_lr

"""The objectives of the classification tasks and how a prediction is scored, by name.

A task spec names its loss (``TaskSpec.loss``); :data:`LOSSES` maps the name to a :class:`Loss`
registered below with :func:`register_loss`. A new task with a new objective registers one more.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Loss:
    """``value(output, target, reduction)`` is the objective over a batch (training; the test
    set is scored by :mod:`mlbench.tasks.scoring`, the same for every framework); ``closed_form``, when given,
    writes the exact gradient of the mean objective (plus L2) into the parameters' ``.grad`` of a
    linear model and returns the objective, with no autograd graph."""

    name: str
    value: Callable[[torch.Tensor, torch.Tensor, str], torch.Tensor]
    closed_form: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, float], torch.Tensor] | None = None


LOSSES: dict[str, Loss] = {}


def register_loss(loss: Loss) -> Loss:
    LOSSES[loss.name] = loss
    return loss


def get_loss(name: str) -> Loss:
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown loss {name!r}; known: {', '.join(LOSSES)}") from None


def regulariser(model: torch.nn.Module, l2: float) -> torch.Tensor | float:
    """lambda/2 |w|^2 over the weight matrices (not biases), as task 2a's objective defines."""
    if l2 == 0:
        return 0.0
    return 0.5 * l2 * sum((p * p).sum() for n, p in model.named_parameters() if n.endswith("weight"))


def _cross_entropy(output: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    return F.cross_entropy(output, target, reduction=reduction)


def _logistic(output: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """log(1 + exp(-y z)) for labels y in {-1, +1}."""
    losses = F.softplus(-target * output)
    return losses.mean() if reduction == "mean" else losses.sum()


def logistic_gradients_(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, l2: float) -> torch.Tensor:
    """Closed-form gradient of mean log(1 + exp(-y z)) + l2/2 |w|^2 into p.grad; returns the loss.

    The gradient of the mean logistic loss is ``X^T s / n`` with ``s = -y * sigmoid(-y z)``: two
    matrix-vector products and no autograd graph, which is most of task 2a's step time.
    """
    linear: torch.nn.Linear = model.linear  # type: ignore[assignment]  # the task's LogisticRegression
    w, b = linear.weight, linear.bias
    assert w.grad is not None
    z = x @ w[0] if b is None else torch.addmv(b.expand(x.shape[0]), x, w[0])
    margin = -y * z
    s = -y * torch.sigmoid(margin) / x.shape[0]
    w.grad.copy_((s @ x).unsqueeze(0))
    if l2:
        w.grad.add_(w, alpha=l2)
    if b is not None and b.grad is not None:
        b.grad.copy_(s.sum().unsqueeze(0))
    return F.softplus(margin).mean() + 0.5 * l2 * (w * w).sum()


CROSS_ENTROPY = register_loss(Loss("cross-entropy", _cross_entropy))
LOGISTIC = register_loss(Loss("logistic", _logistic, closed_form=logistic_gradients_))

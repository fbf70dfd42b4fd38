"""The tasks' objectives and how a prediction is scored."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def regulariser(model: torch.nn.Module, l2: float) -> torch.Tensor | float:
    """lambda/2 |w|^2 over the weight matrices (not biases), as task 2a's objective defines."""
    if l2 == 0:
        return 0.0
    return 0.5 * l2 * sum((p * p).sum() for n, p in model.named_parameters() if n.endswith("weight"))


def batch_loss(kind: str, output: torch.Tensor, target: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy for classification; logistic loss log(1 + exp(-y z)) for labels in {-1,+1}."""
    if kind == "cross-entropy":
        return F.cross_entropy(output, target, reduction=reduction)
    if kind == "logistic":
        losses = F.softplus(-target * output)
        return losses.mean() if reduction == "mean" else losses.sum()
    raise ValueError(f"unknown loss {kind!r}")


def correct_count(kind: str, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if kind == "cross-entropy":
        return (output.argmax(dim=1) == target).sum()
    return ((output >= 0).to(target.dtype) * 2 - 1 == target).sum()

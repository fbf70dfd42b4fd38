"""L2-regularised logistic regression for task 2a (epsilon, labels -1/+1).

The model is only the linear score ``x @ w``: one logit per sample, without a bias, as the
original MLBench's ``LogisticRegression`` (``nn.Linear(n_features, 1, bias=False)``) and as the
objective below, which regularises all of ``w``. The loss (mean log-loss
``log(1 + exp(-y * score))`` plus ``lambda/2 |w|^2``, docs/tasks.md task 2a, from the MLBench task
specification "2a. Linear Learning") belongs to the task, not to the model, so the same module
serves the SGD reference and any fused or closed-form update that reads
``linear.weight`` directly.
"""

from __future__ import annotations

import torch
from torch import nn


class LogisticRegression(nn.Module):
    """A linear map from ``in_features`` to one logit per sample, without bias.

    The parameters start at zero: the objective is strictly convex (L2 term), so the start
    does not change the optimum, and zero gives every run and every worker the same
    seed-independent starting point with loss ``log 2``.

    Args:
        in_features: number of input features (2,000 for epsilon).
    """

    def __init__(self, in_features: int) -> None:
        super().__init__()
        self.in_features = in_features
        self.linear = nn.Linear(in_features, 1, bias=False)
        nn.init.zeros_(self.linear.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of shape [N] (not [N, 1]) for inputs of shape [N, in_features]."""
        return self.linear(x).squeeze(-1)

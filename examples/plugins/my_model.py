"""A complete model plug-in for mlbench (docs/plugins.md): a two-layer perceptron in place of
task 2a's logistic regression (or of task 1a's ResNet, on flattened images).

    mlbench run task2a 2 --model examples/plugins/my_model.py:build
"""

from __future__ import annotations

import math

from torch import nn

HIDDEN = 16


def build(input_shape: tuple[int, ...], num_outputs: int) -> nn.Module:
    """One sample's shape ((3, 32, 32) for CIFAR-10, (features,) for epsilon) and the outputs
    the task's loss reads: a logit per class ([N, 10] for task 1a), or one logit for task 2a,
    whose logistic loss reads shape [N]."""
    layers: list[nn.Module] = [nn.Flatten(), nn.Linear(math.prod(input_shape), HIDDEN), nn.ReLU(),
                               nn.Linear(HIDDEN, num_outputs)]
    if num_outputs == 1:
        layers.append(nn.Flatten(0))  # [N, 1] -> [N]
    return nn.Sequential(*layers)

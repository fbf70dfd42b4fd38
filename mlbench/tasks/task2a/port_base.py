"""What task 2a's JAX and TensorFlow ports share: everything that follows from their weights.

Each port keeps ``w`` in its framework's memory and says how to read it (``weights``); the
evaluation's L2 term, the saved state dict and the absent running statistics are the same
NumPy for both. Framework-free.
"""

from __future__ import annotations

import numpy as np

from mlbench.tasks.classification import ClassificationSettings


class LogisticRegressionWeights:
    """The part of a task-2a port that reads only its weights and settings."""

    settings: ClassificationSettings

    def weights(self) -> np.ndarray:
        """This process's copy of ``w`` (every process holds the same)."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, np.ndarray]:
        """The weights under the PyTorch model's name and in its layout (``linear.weight``, 1 x D)."""
        return {"linear.weight": self.weights()[None, :]}

    def sync_statistics(self) -> None:
        """Nothing: the logistic regression has no running statistics."""

    def regulariser(self) -> float:
        """l2/2 |w|^2, in float64 (the evaluation's L2 term)."""
        w = self.weights().astype(np.float64)
        return 0.5 * self.settings.l2 * float(w @ w)

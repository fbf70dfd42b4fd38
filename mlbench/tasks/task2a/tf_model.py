"""Task 2a in TensorFlow 2: L2 logistic regression, trained by synchronous data-parallel SGD over
processes with ``tf.distribute.MultiWorkerMirroredStrategy``.

The closed division's algorithm, as the PyTorch worker trains it (docs/tasks.md, task 2a; the
settings in :mod:`mlbench.tasks.task2a`): the model is ``z = x @ w`` without bias, ``w`` starts
at zero; the objective is the mean ``log(1 + exp(-y z))`` plus ``l2/2 |w|^2``; every worker takes
the gradient of its own minibatch (``tf.GradientTape``), the workers average the gradients (the
replica context's all-reduce, MultiWorkerMirroredStrategy's ring over gRPC), and the update is
torch.optim.SGD's (dampening 0), written out because Keras' SGD folds the rate into its momentum
buffer (which differs once the rate changes): weight decay added to the gradient, then momentum
(Nesterov when the settings say so), then ``w -= lr * d`` with the rate that mlbench's rule
gives for the step. One replica per process; each process keeps its own copy of ``w`` and of the
momentum buffer, which stay equal because every process applies the same averaged gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from mlbench.tasks.classification import ClassificationSettings
from mlbench.tasks.task2a.port_base import LogisticRegressionWeights
from mlbench.tasks.tf_sgd import mean_over_processes, on_every_replica, restore_after, sgd_update


def objective(w: tf.Tensor, x: tf.Tensor, y: tf.Tensor, l2: float) -> tf.Tensor:
    """Mean log(1 + exp(-y (x @ w))) + l2/2 |w|^2, labels y in {-1, +1}."""
    margin = -y * tf.linalg.matvec(x, w)
    return tf.reduce_mean(tf.nn.softplus(margin)) + 0.5 * l2 * tf.reduce_sum(w * w)


class LogisticRegressionPort(LogisticRegressionWeights):
    """The model's parameters, the momentum buffer and the compiled step (``strategy``: the
    run's MultiWorkerMirroredStrategy; None for a single process, which reduces nothing)."""

    def __init__(self, settings: ClassificationSettings, in_features: int, strategy: Any = None):
        self.settings = settings
        self.strategy = strategy
        # the PyTorch model's start: zero weights; this process's own copies (not mirrored)
        self.w = tf.Variable(tf.zeros([in_features], tf.float32), name="w")
        self.buffer = tf.Variable(tf.zeros([in_features], tf.float32), name="momentum_buffer")
        self.device = strategy.extended.worker_devices[0] if strategy is not None else "/cpu:0"
        # one trace for runs of any number of steps of any batch
        self._step_rows = tf.function(self._distributed_steps, input_signature=[
            tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None], tf.float32)])
        self._forward = tf.function(lambda w, x: tf.linalg.matvec(x, w), reduce_retracing=True)
        self.train_x: tf.Tensor | None = None
        self.train_y: tf.Tensor | None = None

    def _local_step(self, idx: tf.Tensor, lr: tf.Tensor) -> tf.Tensor:
        """The step on this process's minibatch, the rows ``idx`` of the held training set,
        gathered inside the compiled step."""
        assert self.train_x is not None and self.train_y is not None
        s, w = self.settings, self.w
        x, y = tf.gather(self.train_x, idx), tf.gather(self.train_y, idx)
        with tf.GradientTape() as tape:
            loss = objective(w, x, y, s.l2)
        (grad,) = mean_over_processes([tape.gradient(loss, w)], self.strategy, self.device)
        sgd_update([w], [grad], [self.buffer], s, lr)
        return loss

    def _distributed_steps(self, idx: tf.Tensor, lrs: tf.Tensor) -> tf.Tensor:
        """``len(lrs)`` steps in one graph, step ``s`` on the rows ``idx[s]`` at the rate
        ``lrs[s]``: a loop inside the compiled function, as Keras' ``steps_per_execution`` runs
        it. One call runs a logging interval's steps: with one call per step, the function
        call's dispatch was a sixth of the step (docs/performance.md)."""
        steps = tf.shape(lrs)[0]
        losses = tf.TensorArray(tf.float32, size=steps)
        for s in tf.range(steps):
            losses = losses.write(s, on_every_replica(self.strategy, self._local_step, idx[s], lrs[s]))
        return losses.stack()

    def hold_training_set(self, x: np.ndarray, y: np.ndarray) -> None:
        """Keep the training set in this process's TensorFlow memory, so that a step is handed
        only its rows' indices and gathers them inside the compiled step (``tf.gather``), as a
        TensorFlow training loop over data in memory does (measured, it saves little: the step's
        own graph is the cost, docs/performance.md). Every process holds the whole set, as the
        PyTorch worker does."""
        with tf.device(self.device):
            self.train_x = tf.constant(x)
            self.train_y = tf.constant(y)

    def step_rows(self, idx: np.ndarray, lrs: np.ndarray) -> tf.Tensor:
        """``len(lrs)`` synchronous steps, step ``s`` on the rows ``idx[s]`` of the held training
        set (this process's minibatch) at the rate ``lrs[s]``; this process's losses as a tensor,
        read when they are logged."""
        return self._step_rows(tf.constant(idx.astype(np.int32)), tf.constant(lrs.astype(np.float32)))

    def warm_up_rows(self, steps: int, batch: int) -> None:
        """Trace and run :meth:`step_rows` once for ``steps`` steps of ``batch`` rows, then put
        back the weights and the momentum buffer as they were (bit for bit)."""
        restore_after(lambda: self.step_rows(np.zeros((steps, batch), np.int32), np.zeros(steps, np.float32)).numpy(),
                      [self.w, self.buffer])

    def weights(self) -> np.ndarray:
        """This process's copy of ``w`` (every process holds the same)."""
        return self.w.numpy()

    def logits(self, x: np.ndarray) -> np.ndarray:
        """The logits of ``x`` with this process's copy of the weights (no collective)."""
        return self._forward(self.w, tf.constant(x)).numpy()

    @property
    def num_parameters(self) -> int:
        return int(self.w.shape[0])


def make_port(settings: ClassificationSettings, in_features: int,
              reference_state: Callable[[], dict[str, np.ndarray]], strategy: Any = None) -> LogisticRegressionPort:
    """Task 2a's TensorFlow port (:meth:`mlbench.frameworks.Framework.port_module`), in the run's
    ``strategy``; its weights start at zero, as the PyTorch model's (no ``reference_state``)."""
    return LogisticRegressionPort(settings, in_features, strategy)

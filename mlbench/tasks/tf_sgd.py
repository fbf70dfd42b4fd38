"""What the TensorFlow ports share (:mod:`mlbench.tasks.task2a.tf_model`, :mod:`mlbench.tasks.task1a.tf_model`):
the gradients' mean over the processes, torch.optim.SGD's update, a step run on every replica, and
a warm-up step whose effects are undone.

The update is written out because Keras' SGD folds the rate into its momentum buffer, which
differs from PyTorch's once the rate changes (warm-up, decay): the closed division's update is
torch.optim.SGD's with dampening 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from mlbench.tasks.classification import ClassificationSettings


def mean_over_processes(grads: Sequence[tf.Tensor], strategy: Any, device: str) -> Sequence[tf.Tensor]:
    """The gradients averaged over the processes (the replica context's all-reduce, the
    strategy's ring over gRPC); as they are for a single process (``strategy`` None)."""
    if strategy is None:
        return grads
    with tf.device(device):   # placed tensors: the collective needs their device
        placed = [tf.identity(g) for g in grads]
    return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.MEAN, placed)


def sgd_update(params: Sequence[tf.Variable], grads: Sequence[tf.Tensor], buffers: Sequence[tf.Variable],
               settings: ClassificationSettings, lr: tf.Tensor) -> None:
    """torch.optim.SGD's step (dampening 0): weight decay added to the gradient, then momentum
    (Nesterov when the settings say so), then ``p -= lr * d``."""
    for p, g, buf in zip(params, grads, buffers, strict=True):
        d = g + settings.weight_decay * p if settings.weight_decay else g
        if settings.momentum:
            buf.assign(settings.momentum * buf + d)
            d = d + settings.momentum * buf if settings.nesterov else buf
        p.assign_sub(lr * d)


def on_every_replica(strategy: Any, local_step: Callable[..., tf.Tensor], *args: tf.Tensor) -> tf.Tensor:
    """``local_step(*args)`` on this process's replica (under the strategy when there is one);
    this process's result."""
    if strategy is None:
        return local_step(*args)
    results = strategy.run(local_step, args=args)
    return strategy.experimental_local_results(results)[0]


def restore_after(run: Callable[[], Any], variables: Sequence[tf.Variable]) -> None:
    """``run()`` (a warm-up step: tf.function traces and TensorFlow instantiates its graph on the
    first call), then every one of ``variables`` back to its value before it."""
    saved = [v.numpy() for v in variables]
    run()
    for v, value in zip(variables, saved, strict=True):
        v.assign(value)

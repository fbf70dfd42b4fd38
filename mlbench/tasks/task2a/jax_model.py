"""Task 2a in JAX: L2 logistic regression, trained by synchronous data-parallel SGD over processes.

The closed division's algorithm, as the PyTorch worker trains it (docs/tasks.md, task 2a; the
settings in :mod:`mlbench.tasks.task2a`): the model is ``z = x @ w`` without bias, ``w`` starts
at zero; the objective is the mean ``log(1 + exp(-y z))`` plus ``l2/2 |w|^2``; every worker takes
the gradient of its own minibatch (``jax.grad``), the workers average the gradients (``pmean``
over the mesh of all processes' devices, gloo on CPUs), and the update is torch.optim.SGD's
(dampening 0): weight decay added to the gradient, then momentum (``optax.trace``, Nesterov
when the settings say so), then ``w -= lr * d`` with the rate that mlbench's rule gives for the
step. One device per process: rank r's minibatch is the r-th shard of the global batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from mlbench.tasks.classification import ClassificationSettings
from mlbench.tasks.task2a.port_base import LogisticRegressionWeights

AXIS = "workers"


def objective(w: jax.Array, x: jax.Array, y: jax.Array, l2: float) -> jax.Array:
    """Mean log(1 + exp(-y (x @ w))) + l2/2 |w|^2, labels y in {-1, +1}."""
    margin = -y * (x @ w)
    return jnp.mean(jax.nn.softplus(margin)) + 0.5 * l2 * jnp.sum(w * w)


class LogisticRegressionPort(LogisticRegressionWeights):
    """The model's parameters, the optimizer's state and the jitted step, on a mesh of one
    device per process (a single process: a mesh of one)."""

    def __init__(self, settings: ClassificationSettings, in_features: int):
        self.settings = settings
        self.mesh = Mesh(np.array(jax.devices()), (AXIS,))
        self.replicated = NamedSharding(self.mesh, P())
        self.sharded = NamedSharding(self.mesh, P(AXIS))
        self.tx = optax.chain(optax.add_decayed_weights(settings.weight_decay),
                              optax.trace(decay=settings.momentum, nesterov=settings.nesterov))
        w = np.zeros(in_features, np.float32)   # the PyTorch model's start: zero weights
        self.params = self._replicate(w)
        self.opt_state = jax.tree.map(self._replicate, self.tx.init(jnp.asarray(w)))
        self._step_rows = jax.jit(self._make_step())
        self._forward = jax.jit(lambda w, x: x @ w)
        self.train_x: jax.Array | None = None
        self.train_y: jax.Array | None = None

    def _replicate(self, value: Any) -> jax.Array:
        return jax.make_array_from_process_local_data(self.replicated, np.asarray(value))

    def _make_step(self) -> Any:
        """The step on the rows of the held training set whose indices each worker hands over
        (the indices sharded over the workers, the set replicated)."""
        l2, tx = self.settings.l2, self.tx

        def local_step(w: jax.Array, state: Any, x: jax.Array, y: jax.Array,
                       lr: jax.Array) -> tuple[jax.Array, Any, jax.Array]:
            # the gradient of this worker's own minibatch: taken with respect to a per-device
            # ("varying") copy of w, since the gradient with respect to the replicated w itself
            # would be summed over the workers by shard_map's autodiff already
            local_w = jax.lax.pcast(w, AXIS, to="varying")
            loss, grad = jax.value_and_grad(objective)(local_w, x, y, l2)
            grad = jax.lax.pmean(grad, AXIS)   # the all-reduce of the gradients
            direction, state = tx.update(grad, state, w)
            return w - lr * direction, state, loss[None]

        def rows_step(w: jax.Array, state: Any, xs: jax.Array, ys: jax.Array, idx: jax.Array,
                      lr: jax.Array) -> tuple[jax.Array, Any, jax.Array]:
            return local_step(w, state, jnp.take(xs, idx, axis=0), jnp.take(ys, idx, axis=0), lr)

        return jax.shard_map(rows_step, mesh=self.mesh,
                             in_specs=(P(), P(), P(), P(), P(AXIS), P()),
                             out_specs=(P(), P(), P(AXIS)))

    def hold_training_set(self, x: np.ndarray, y: np.ndarray) -> None:
        """Keep the training set on this process's device, so that a step is handed only its
        rows' indices and gathers them inside the compiled program (as JAX's own training loops
        do; handing over a gathered minibatch cost 2.7 times a step of its own). Every process
        holds the whole set, as the PyTorch worker does. On a CPU the device array is the same
        memory when ``x`` is 64-byte aligned (torch's allocations are), not a copy."""
        self.train_x = jax.make_array_from_process_local_data(self.replicated, x)
        self.train_y = jax.make_array_from_process_local_data(self.replicated, y)

    def _run_step(self, idx: np.ndarray, lr: float) -> tuple[jax.Array, Any, jax.Array]:
        """The compiled step on the rows ``idx``: the new weights, optimizer state and losses
        (JAX's arrays are values: the port's own are left as they are)."""
        assert self.train_x is not None and self.train_y is not None, "hold_training_set() first"
        gidx = jax.make_array_from_process_local_data(self.sharded, idx.astype(np.int32))
        rate = self._replicate(np.float32(lr))
        return self._step_rows(self.params, self.opt_state, self.train_x, self.train_y, gidx, rate)

    def step_rows(self, idx: np.ndarray, lr: float) -> jax.Array:
        """One synchronous step on the rows ``idx`` of the held training set (this process's
        minibatch); this process's loss as a device array, read when it is logged."""
        self.params, self.opt_state, losses = self._run_step(idx, lr)
        return losses.addressable_data(0)[0]

    def warm_up_rows(self, idx: np.ndarray) -> None:
        """Compile :meth:`step_rows` for ``len(idx)`` rows: one step, waited for, its results
        dropped (and the indexing that takes this process's loss, a program of its own)."""
        jax.block_until_ready(self._run_step(idx, 0.0)[2].addressable_data(0)[0])

    def weights(self) -> np.ndarray:
        """This process's copy of ``w`` (every process holds the same)."""
        return np.asarray(self.params.addressable_data(0))

    def logits(self, x: np.ndarray) -> np.ndarray:
        """The logits of ``x`` with this process's copy of the weights (no collective)."""
        w = self.params.addressable_data(0)
        return np.asarray(self._forward(w, jnp.asarray(x)))

    @property
    def num_parameters(self) -> int:
        return int(self.params.shape[0])


def make_port(settings: ClassificationSettings, in_features: int,
              reference_state: Callable[[], dict[str, np.ndarray]]) -> LogisticRegressionPort:
    """Task 2a's JAX port (:meth:`mlbench.frameworks.Framework.port_module`); its weights start
    at zero, as the PyTorch model's, so it takes no ``reference_state``."""
    return LogisticRegressionPort(settings, in_features)

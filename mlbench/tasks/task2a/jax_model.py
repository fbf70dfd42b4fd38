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
        self.sharded_steps = NamedSharding(self.mesh, P(None, AXIS))   # [steps, rows of each worker]
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
        """The program of a run of steps: ``lax.scan`` of the step over the rows of the held
        training set whose indices each worker hands over for each step (the indices sharded
        over the workers, the set replicated), with each step's rate. One call runs a logging
        interval's steps: with one call per step, the host's dispatch and the two transfers onto
        the mesh took 0.5 ms around a 0.3 ms step (docs/performance.md)."""
        l2, tx = self.settings.l2, self.tx

        def local_step(carry: tuple[jax.Array, Any], step: tuple[jax.Array, jax.Array], xs: jax.Array,
                       ys: jax.Array) -> tuple[tuple[jax.Array, Any], jax.Array]:
            (w, state), (idx, lr) = carry, step
            x, y = jnp.take(xs, idx, axis=0), jnp.take(ys, idx, axis=0)
            # the gradient of this worker's own minibatch: taken with respect to a per-device
            # ("varying") copy of w, since the gradient with respect to the replicated w itself
            # would be summed over the workers by shard_map's autodiff already
            local_w = jax.lax.pcast(w, AXIS, to="varying")
            loss, grad = jax.value_and_grad(objective)(local_w, x, y, l2)
            grad = jax.lax.pmean(grad, AXIS)   # the all-reduce of the gradients
            direction, state = tx.update(grad, state, w)
            return (w - lr * direction, state), loss[None]

        def rows_steps(w: jax.Array, state: Any, xs: jax.Array, ys: jax.Array, idx: jax.Array,
                       lrs: jax.Array) -> tuple[jax.Array, Any, jax.Array]:
            (w, state), losses = jax.lax.scan(lambda c, s: local_step(c, s, xs, ys), (w, state), (idx, lrs))
            return w, state, losses

        return jax.shard_map(rows_steps, mesh=self.mesh,
                             in_specs=(P(), P(), P(), P(), P(None, AXIS), P()),
                             out_specs=(P(), P(), P(None, AXIS)))

    def hold_training_set(self, x: np.ndarray, y: np.ndarray) -> None:
        """Keep the training set on this process's device, so that a step is handed only its
        rows' indices and gathers them inside the compiled program (as JAX's own training loops
        do; handing over a gathered minibatch cost 2.7 times a step of its own). Every process
        holds the whole set, as the PyTorch worker does. On a CPU the device array is the same
        memory when ``x`` is 64-byte aligned (torch's allocations are), not a copy."""
        self.train_x = jax.make_array_from_process_local_data(self.replicated, x)
        self.train_y = jax.make_array_from_process_local_data(self.replicated, y)

    def _run_steps(self, idx: np.ndarray, lrs: np.ndarray) -> tuple[jax.Array, Any, jax.Array]:
        """The compiled steps on the rows ``idx[s]`` at the rates ``lrs[s]``: the new weights,
        optimizer state and losses (JAX's arrays are values: the port's own are left as they are)."""
        assert self.train_x is not None and self.train_y is not None, "hold_training_set() first"
        gidx = jax.make_array_from_process_local_data(self.sharded_steps, idx.astype(np.int32))
        rates = self._replicate(lrs.astype(np.float32))
        return self._step_rows(self.params, self.opt_state, self.train_x, self.train_y, gidx, rates)

    def step_rows(self, idx: np.ndarray, lrs: np.ndarray) -> jax.Array:
        """``len(lrs)`` synchronous steps, step ``s`` on the rows ``idx[s]`` of the held training
        set (this process's minibatch) at the rate ``lrs[s]``; this process's losses as a device
        array (``[steps, 1]``: its shard), read when they are logged."""
        self.params, self.opt_state, losses = self._run_steps(idx, lrs)
        return losses.addressable_data(0)

    def warm_up_rows(self, steps: int, batch: int) -> None:
        """Compile :meth:`step_rows` for ``steps`` steps of ``batch`` rows: a call on row 0,
        waited for, its results dropped."""
        losses = self._run_steps(np.zeros((steps, batch), np.int32), np.zeros(steps, np.float32))[2]
        jax.block_until_ready(losses)

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

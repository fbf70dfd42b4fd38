"""Task 1a in JAX: ResNet-20 (any ResNet-CIFAR of :mod:`mlbench.tasks.task1a.model`, v1 or v2),
trained by synchronous data-parallel SGD over processes.

The closed division's algorithm as the PyTorch worker trains it (docs/tasks.md, task 1a), in
plain JAX so that every detail is PyTorch's and visible here:

* **The model** is mlbench's PyTorch ``ResNetCIFAR``, layer for layer: 3x3 convolutions with
  padding 1 and no bias, projection shortcuts ``1x1 conv stride 2 + BN``, global average
  pooling, a linear classifier. Computed in NHWC (XLA's layout on CPUs): the images arrive as
  PyTorch's NCHW and are transposed, the convolutions' OIHW weights become HWIO.
* **The initial weights** are the PyTorch model's for the run's seed (taken from it as NumPy
  arrays, :meth:`mlbench.worker.port_trainer.PortTrainer.reference_state`): the same start,
  exactly, instead of the same distribution drawn by another generator.
* **BatchNorm** is ``torch.nn.BatchNorm2d``'s: in training the batch's mean and biased variance
  normalise (eps 1e-5), and the running statistics move by momentum 0.1 towards the batch's
  mean and *unbiased* variance; evaluation normalises by the running statistics. Each worker
  normalises its own minibatch and keeps its own running statistics (the PyTorch worker's
  centralized SGD all-reduces gradients only); before an evaluation the running statistics
  are averaged over the workers (:meth:`ResNetPort.sync_statistics`, as
  ``SupervisedRuntime._sync_buffers``), in place, and training goes on from the averages.
* **The update** is torch.optim.SGD's (dampening 0) on every parameter, BatchNorm's and the
  biases included, as the PyTorch worker applies it: weight decay added to the averaged
  gradient, momentum 0.9 with Nesterov (``optax.trace``), ``p -= lr * d``; the loss is the mean
  cross-entropy (plus the task's L2 term on the weights, zero for task 1a).

One CPU device per process on a mesh of all processes' devices (``shard_map``): the parameters
and the optimizer's state are replicated, the gradients ``pmean``'d; the running statistics
differ per worker, so they live as one row per worker of an array sharded over the mesh.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from mlbench.tasks.classification import ClassificationSettings

AXIS = "workers"
#: torch.nn.BatchNorm2d's defaults, which the PyTorch model keeps.
BN_MOMENTUM, BN_EPS = 0.1, 1e-5
RUNNING = (".running_mean", ".running_var")

Tree = dict[str, jax.Array]


def to_jax_layout(state: dict[str, np.ndarray], dtype: Any = np.float32,
                  ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(parameters, running statistics) of a PyTorch ResNet state dict, by the PyTorch names:
    convolutions OIHW -> HWIO, the classifier's [out, in] -> [in, out]; ``num_batches_tracked``
    dropped (BatchNorm reads it only without a momentum)."""
    params, stats = {}, {}
    for name, value in state.items():
        if name.endswith(RUNNING):
            stats[name] = value.astype(dtype)
        elif name.endswith(".num_batches_tracked"):
            continue
        elif value.ndim == 4:
            params[name] = value.transpose(2, 3, 1, 0).astype(dtype)
        elif value.ndim == 2:
            params[name] = value.T.astype(dtype)
        else:
            params[name] = value.astype(dtype)
    return params, stats


class ResNetForward:
    """The forward pass of ``ResNetCIFAR(depth, version)`` on parameters named as PyTorch's."""

    def __init__(self, depth: int, version: int, names: set[str]):
        self.version = version
        blocks = (depth - 2) // 6
        #: (prefix, stride, has a projection shortcut) of every block, in order
        self.blocks = [(f"stages.{s}.{b}", 2 if s > 0 and b == 0 else 1,
                        f"stages.{s}.{b}.shortcut.0.weight" in names)
                       for s in range(3) for b in range(blocks)]

    def __call__(self, params: Tree, stats: Tree, x: jax.Array, train: bool) -> tuple[jax.Array, Tree]:
        """Logits of ``x`` (NCHW, as PyTorch's) and, in training, the updated running statistics."""
        new_stats: Tree = {}

        def bn(h: jax.Array, name: str) -> jax.Array:
            mean_name, var_name = name + RUNNING[0], name + RUNNING[1]
            if train:
                mean = jnp.mean(h, axis=(0, 1, 2))
                var = jnp.mean(jnp.square(h - mean), axis=(0, 1, 2))   # biased: what normalises
                n = h.size // h.shape[-1]
                unbiased = var * (n / (n - 1))                          # what the running variance tracks
                new_stats[mean_name] = (1 - BN_MOMENTUM) * stats[mean_name] + BN_MOMENTUM * lax.stop_gradient(mean)
                new_stats[var_name] = (1 - BN_MOMENTUM) * stats[var_name] + BN_MOMENTUM * lax.stop_gradient(unbiased)
            else:
                mean, var = stats[mean_name], stats[var_name]
            return (h - mean) * lax.rsqrt(var + BN_EPS) * params[name + ".weight"] + params[name + ".bias"]

        def conv(h: jax.Array, name: str, stride: int = 1) -> jax.Array:
            w = params[name]
            pad = (w.shape[0] - 1) // 2
            return lax.conv_general_dilated(h, w, (stride, stride), ((pad, pad), (pad, pad)),
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

        h = jnp.transpose(x, (0, 2, 3, 1))
        h = jax.nn.relu(bn(conv(h, "stem.0.weight"), "stem.1"))
        for prefix, stride, projection in self.blocks:
            shortcut = h
            if projection:
                shortcut = bn(conv(h, f"{prefix}.shortcut.0.weight", stride), f"{prefix}.shortcut.1")
            if self.version == 1:
                out = jax.nn.relu(bn(conv(h, f"{prefix}.conv1.weight", stride), f"{prefix}.bn1"))
                out = bn(conv(out, f"{prefix}.conv2.weight"), f"{prefix}.bn2")
                h = jax.nn.relu(out + shortcut)
            else:
                out = conv(jax.nn.relu(bn(h, f"{prefix}.bn1")), f"{prefix}.conv1.weight", stride)
                out = conv(jax.nn.relu(bn(out, f"{prefix}.bn2")), f"{prefix}.conv2.weight")
                h = out + shortcut
        pooled = jnp.mean(h, axis=(1, 2))
        logits = pooled @ params["classifier.weight"] + params["classifier.bias"]
        return logits, (new_stats if train else stats)


def cross_entropy(logits: jax.Array, y: jax.Array) -> jax.Array:
    """The mean cross-entropy of integer labels (torch.nn.functional.cross_entropy's)."""
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


class ResNetPort:
    """The parameters, the optimizer's state, each worker's running statistics and the jitted
    step, on a mesh of one device per process (a single process: a mesh of one).

    ``dtype``: float32, as the PyTorch worker trains; float64 (under ``jax.enable_x64``) lets a
    test check the algorithm against PyTorch's in float64, to rounding."""

    def __init__(self, settings: ClassificationSettings, depth: int, version: int, state: dict[str, np.ndarray],
                 dtype: Any = np.float32):
        self.settings = settings
        params, stats = to_jax_layout(state, dtype)
        #: PyTorch's state_dict order of the parameters and running statistics (:meth:`state_dict`)
        self.order = [k for k in state if k in params or k in stats]
        self.forward = ResNetForward(depth, version, set(params))
        self.mesh = Mesh(np.array(jax.devices()), (AXIS,))
        self.replicated = NamedSharding(self.mesh, P())
        self.sharded = NamedSharding(self.mesh, P(AXIS))
        self.tx = optax.chain(optax.add_decayed_weights(settings.weight_decay),
                              optax.trace(decay=settings.momentum, nesterov=settings.nesterov))
        self.params = jax.tree.map(self._replicate, params)
        self.opt_state = jax.tree.map(self._replicate, self.tx.init(jax.tree.map(jnp.asarray, params)))
        self.stats = jax.tree.map(lambda s: self._per_worker(s[None]), stats)
        self._step = jax.jit(self._make_step())
        self._average = jax.jit(jax.shard_map(lambda s: jax.tree.map(lambda a: lax.pmean(a, AXIS), s),
                                              mesh=self.mesh, in_specs=P(AXIS), out_specs=P(AXIS)))
        self._logits = jax.jit(lambda p, s, x: self.forward(p, s, x, train=False)[0])

    def _replicate(self, value: Any) -> jax.Array:
        return jax.make_array_from_process_local_data(self.replicated, np.asarray(value))

    def _per_worker(self, value: Any) -> jax.Array:
        return jax.make_array_from_process_local_data(self.sharded, np.asarray(value))

    def _make_step(self) -> Callable[..., Any]:
        l2, tx, forward = self.settings.l2, self.tx, self.forward

        def objective(params: Tree, stats: Tree, x: jax.Array, y: jax.Array) -> tuple[jax.Array, Tree]:
            logits, new_stats = forward(params, stats, x, train=True)
            loss = cross_entropy(logits, y)
            if l2:   # the task's L2 term on the weights (mlbench.tasks.losses.regulariser)
                loss = loss + 0.5 * l2 * sum(jnp.sum(w * w) for n, w in params.items() if n.endswith("weight"))
            return loss, new_stats

        def local_step(params: Tree, state: Any, stats: Tree, x: jax.Array, y: jax.Array,
                       lr: jax.Array) -> tuple[Tree, Any, Tree, jax.Array]:
            # the gradient of this worker's own minibatch, taken with respect to a per-device
            # ("varying") copy of the parameters: with respect to the replicated parameters
            # themselves, shard_map's autodiff would sum it over the workers already
            local = jax.lax.pcast(params, AXIS, to="varying")
            own = jax.tree.map(lambda s: s[0], stats)
            (loss, own), grads = jax.value_and_grad(objective, has_aux=True)(local, own, x, y)
            grads = lax.pmean(grads, AXIS)   # the all-reduce of the gradients
            direction, state = tx.update(grads, state, params)
            params = jax.tree.map(lambda p, d: p - lr * d, params, direction)
            return params, state, jax.tree.map(lambda s: s[None], own), loss[None]

        return jax.shard_map(local_step, mesh=self.mesh,
                             in_specs=(P(), P(), P(AXIS), P(AXIS), P(AXIS), P()),
                             out_specs=(P(), P(), P(AXIS), P(AXIS)))

    def _run_step(self, x: np.ndarray, y: np.ndarray, lr: float) -> tuple[Tree, Any, Tree, jax.Array]:
        """The compiled step on this process's minibatch: the new parameters, optimizer state,
        running statistics and losses (JAX's arrays are values: the port's own are left as they are)."""
        rate = self._replicate(np.asarray(lr, self.params["classifier.bias"].dtype))
        return self._step(self.params, self.opt_state, self.stats, self._per_worker(x), self._per_worker(y), rate)

    def step(self, x: np.ndarray, y: np.ndarray, lr: float) -> float:
        """One synchronous step on this process's minibatch; returns this process's loss."""
        self.params, self.opt_state, self.stats, losses = self._run_step(x, y, lr)
        return float(np.asarray(losses.addressable_data(0))[0])

    def warm_up(self, x: np.ndarray, y: np.ndarray) -> None:
        """Compile :meth:`step` for minibatches shaped as ``x``, ``y``: one step, waited for, its
        results dropped."""
        jax.block_until_ready(self._run_step(x, y, 0.0))

    def sync_statistics(self) -> None:
        """Every worker's running statistics become their mean (the PyTorch worker's
        ``_sync_buffers``); training goes on from them."""
        self.stats = self._average(self.stats)

    def _local(self) -> tuple[Tree, Tree]:
        params = {n: p.addressable_data(0) for n, p in self.params.items()}
        stats = {n: s.addressable_data(0)[0] for n, s in self.stats.items()}
        return params, stats

    def weights(self) -> np.ndarray:
        """This process's copy of the parameters, flat (every process holds the same). Read
        into NumPy without a JAX operation: indexing the per-worker statistics, as :meth:`_local`
        does, compiles a program per shape, which the first logging interval paid for."""
        return np.concatenate([np.asarray(p.addressable_data(0)).ravel() for p in self.params.values()])

    def state_dict(self) -> dict[str, np.ndarray]:
        """This process's parameters and running statistics under PyTorch's names, in its
        layouts and its order (what ``ResNetCIFAR.load_state_dict`` takes, less
        ``num_batches_tracked``): HWIO -> OIHW, the classifier's [in, out] -> [out, in]."""
        values = {n: np.asarray(p.addressable_data(0)) for n, p in self.params.items()}
        values.update({n: np.asarray(s.addressable_data(0))[0] for n, s in self.stats.items()})
        out: dict[str, np.ndarray] = {}
        for name in self.order:
            value = values[name]
            if value.ndim == 4:
                value = value.transpose(3, 2, 0, 1)
            elif value.ndim == 2:
                value = value.T
            out[name] = np.ascontiguousarray(value)
        return out

    def logits(self, x: np.ndarray) -> np.ndarray:
        """The logits of ``x`` with this process's parameters and running statistics (no collective)."""
        params, stats = self._local()
        return np.asarray(self._logits(params, stats, jnp.asarray(x)))

    def regulariser(self) -> float:
        """l2/2 |weights|^2 in float64 over the parameters named ``weight`` (the evaluation's L2 term)."""
        if not self.settings.l2:
            return 0.0
        params, _ = self._local()
        total = sum(float(np.sum(np.asarray(w, np.float64) ** 2)) for n, w in params.items() if n.endswith("weight"))
        return 0.5 * self.settings.l2 * total

    @property
    def num_parameters(self) -> int:
        return int(sum(p.size for p in self.params.values()))


def make_port(settings: ClassificationSettings, in_features: int,
              reference_state: Callable[[], dict[str, np.ndarray]]) -> ResNetPort:
    """Task 1a's JAX port (:meth:`mlbench.frameworks.Framework.port_module`): the ResNet of the
    run's settings, from the PyTorch model's weights for the run's seed (``reference_state``)."""
    return ResNetPort(settings, *_layout(settings.model), reference_state())


def _layout(model: str) -> tuple[int, int]:
    """The depth and version of the ResNet ``model`` names; a port builds only ResNets."""
    from mlbench.errors import UsageError
    from mlbench.tasks.models import resnet_layout

    layout = resnet_layout(model)
    if layout is None:
        raise UsageError(f"task1a's port builds mlbench's ResNets (resnet20-v1, ...), not {model}", option="set")
    return layout

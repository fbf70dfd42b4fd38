"""Task 1a in TensorFlow 2: mlbench's ResNet for CIFAR-10 (:mod:`mlbench.tasks.task1a.model`,
v1 or v2, any depth 6n+2), trained by synchronous data-parallel SGD over processes with
``tf.distribute.MultiWorkerMirroredStrategy``, as :mod:`mlbench.tasks.task2a.tf_model` trains task 2a.

The port computes what the PyTorch worker computes, so that the two train the same from the same
weights (tests/frameworks/test_tf_resnet.py):

* **The weights** are the PyTorch reference's (:meth:`ResNetPort.from_reference` draws them with
  mlbench's own model and seed), converted losslessly: convolutions OIHW -> HWIO, the classifier's
  ``[out, in]`` transposed, the BatchNorm running statistics as they are. :meth:`state_dict`
  converts back, under PyTorch's names.
* **The layout**: the images come as mlbench's pipeline hands them to every framework, NCHW
  float32 (augmented and normalised by :mod:`mlbench.tasks.data.augment`); the compiled step
  transposes them to NHWC, TensorFlow's layout on CPUs. Convolutions pad explicitly (1 pixel on
  every side for 3x3, none for 1x1), as PyTorch's ``padding=1``: TensorFlow's ``SAME`` pads a
  stride-2 convolution of an even size only at the bottom and right.
* **BatchNorm with PyTorch's semantics** (written out, not Keras' layer): training normalises by
  the batch's mean and biased variance over N, H, W with eps 1e-5, and updates the running
  statistics ``r <- (1 - 0.1) r + 0.1 b`` (Keras' ``momentum=0.9``) with the *unbiased* batch
  variance ``v n / (n - 1)``, as PyTorch does (Keras' layer keeps the biased one); evaluation
  normalises by the running statistics. Each process keeps its own running statistics, as each
  PyTorch worker does; :meth:`ResNetPort.average_running_stats` averages them over the processes
  before an evaluation, as the PyTorch runtime does.
* **The step**: the mean cross-entropy (plus ``l2/2`` of the squares of the parameters named
  ``weight``, mlbench's regulariser, 0 for task 1a) of this process's minibatch, its gradients by
  ``tf.GradientTape``, averaged over the processes by the replica context's all-reduce, then
  torch.optim.SGD's update written out (weight decay added to the gradient, momentum with
  dampening 0, Nesterov when the settings say so, ``p -= lr d``): Keras' SGD folds the rate into
  its momentum buffer, which differs once the rate changes.

No XLA (``jit_compile``), as in :mod:`mlbench.tasks.task2a.tf_model`: the step is a plain
``tf.function``, so both TensorFlow ports run the same kind of program. ``dtype="float64"`` runs
the same code in double precision: float32 training of a ReLU net is chaotic (a pre-activation
within rounding of 0 switches), so the exact comparison with PyTorch is made in float64
(docs/worker-contract.md); runs train in float32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from mlbench.tasks.classification import ClassificationSettings
from mlbench.tasks.tf_sgd import mean_over_processes, on_every_replica, restore_after, sgd_update

#: PyTorch's BatchNorm2d defaults: the running statistics' momentum and the epsilon.
BN_MOMENTUM = 0.1
BN_EPS = 1e-5
#: Output channels of the three stages (:data:`mlbench.tasks.task1a.model.STAGE_CHANNELS`).
STAGE_CHANNELS = (16, 32, 64)


def batch_norm_train(x: tf.Tensor, gamma: tf.Tensor, beta: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """PyTorch's BatchNorm2d in training mode on NHWC ``x``: the output (normalised by the batch's
    mean and biased variance), and the batch's mean and *unbiased* variance (what PyTorch's running
    statistics take in)."""
    mean, var = tf.nn.moments(x, axes=[0, 1, 2])
    n = int(x.shape[0]) * int(x.shape[1]) * int(x.shape[2])
    out = tf.nn.batch_normalization(x, mean, var, beta, gamma, BN_EPS)
    return out, mean, var * (n / max(n - 1, 1))


def running_update(running: tf.Variable, batch: tf.Tensor) -> None:
    """``running <- (1 - momentum) running + momentum batch``, PyTorch's rule (momentum 0.1)."""
    running.assign((1.0 - BN_MOMENTUM) * running + BN_MOMENTUM * batch)


def layer_names(depth: int, version: int) -> tuple[list[str], list[str]]:
    """The PyTorch model's convolutions and BatchNorms, by their state_dict prefixes, in the order
    of its ``state_dict`` (:class:`mlbench.tasks.task1a.model.ResNetCIFAR`)."""
    convs, norms = ["stem.0"], ["stem.1"]
    in_channels = STAGE_CHANNELS[0]
    for stage, channels in enumerate(STAGE_CHANNELS):
        for block in range((depth - 2) // 6):
            prefix = f"stages.{stage}.{block}"
            stride = 2 if stage > 0 and block == 0 else 1
            convs += [f"{prefix}.conv1", f"{prefix}.conv2"]
            norms += [f"{prefix}.bn1", f"{prefix}.bn2"]
            if stride != 1 or in_channels != channels:
                convs.append(f"{prefix}.shortcut.0")
                norms.append(f"{prefix}.shortcut.1")
            in_channels = channels
    return convs, norms


class ResNetPort:
    """ResNet-(6n+2) v1/v2 with its running statistics, the momentum buffers and the compiled step
    (``strategy``: the run's MultiWorkerMirroredStrategy; None for a single process, which
    reduces nothing). ``state``: the PyTorch model's ``state_dict`` as NumPy arrays (names and
    layouts as PyTorch's), the weights every framework starts from."""

    def __init__(self, settings: ClassificationSettings, depth: int, version: int, state: dict[str, np.ndarray],
                 strategy: Any = None, dtype: str = "float32"):
        if depth < 8 or (depth - 2) % 6 != 0 or version not in (1, 2):
            raise ValueError(f"no ResNet-CIFAR of depth {depth}, version {version}")
        self.settings, self.depth, self.version, self.strategy = settings, depth, version, strategy
        self.dtype = tf.as_dtype(dtype)
        convs, norms = layer_names(depth, version)
        #: the trainable parameters under PyTorch's names, in TensorFlow's layouts
        self.params: dict[str, tf.Variable] = {}
        #: the BatchNorm running statistics (``.running_mean``, ``.running_var``)
        self.stats: dict[str, tf.Variable] = {}
        for name in convs:
            self.params[f"{name}.weight"] = self._variable(name + ".weight", state, (2, 3, 1, 0))
        for name in norms:
            for field in ("weight", "bias"):
                self.params[f"{name}.{field}"] = self._variable(f"{name}.{field}", state)
            for field in ("running_mean", "running_var"):
                self.stats[f"{name}.{field}"] = self._variable(f"{name}.{field}", state, trainable=False)
        self.params["classifier.weight"] = self._variable("classifier.weight", state, (1, 0))
        self.params["classifier.bias"] = self._variable("classifier.bias", state)
        # PyTorch's state_dict order, which weights(), state_dict() and the L2 term follow
        self.order = [k for k in state if k in self.params or k in self.stats]
        order = [k for k in self.order if k in self.params]
        self.params = {k: self.params[k] for k in order}
        self._trainable = list(self.params.values())
        self._decayed = [v for k, v in self.params.items() if k.endswith("weight")]
        self.buffers = [tf.Variable(tf.zeros_like(v), trainable=False, name="momentum_buffer")
                        for v in self._trainable]
        self.device = strategy.extended.worker_devices[0] if strategy is not None else "/cpu:0"
        self._step = tf.function(self._distributed_step, reduce_retracing=True)
        self._forward = tf.function(lambda x: self._logits(x, None), reduce_retracing=True)
        self._average = tf.function(self._distributed_average)

    @classmethod
    def from_reference(cls, settings: ClassificationSettings, seed: int, strategy: Any = None,
                       dtype: str = "float32") -> ResNetPort:
        """The settings' model (``resnet20-v1``, ...) from the weights the PyTorch worker draws:
        mlbench's model built after ``torch.manual_seed(seed)``, as
        :class:`mlbench.tasks.classification_runtime.SupervisedRuntime` builds it (the global
        torch random state is left as it was)."""
        import torch

        from mlbench.tasks.models import build_model
        from mlbench.tasks.task1a.model import ResNetCIFAR

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = build_model(settings.model)
        if not isinstance(model, ResNetCIFAR):
            raise ValueError(f"the TensorFlow ResNet port trains a ResNet, not {settings.model!r}")
        state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
        return cls(settings, model.depth, model.version, state, strategy, dtype)

    def _variable(self, name: str, state: dict[str, np.ndarray], perm: tuple[int, ...] | None = None,
                  trainable: bool = True) -> tf.Variable:
        if name not in state:
            raise ValueError(f"the initial state has no {name!r}: not mlbench's ResNet of this depth and version")
        value = np.asarray(state[name], self.dtype.as_numpy_dtype)
        return tf.Variable(value.transpose(perm) if perm else value, trainable=trainable, name=name)

    # -- the model ------------------------------------------------------------------------------
    def _conv(self, x: tf.Tensor, name: str, stride: int) -> tf.Tensor:
        w = self.params[f"{name}.weight"]
        pad = int(w.shape[0]) // 2   # PyTorch's padding: 1 for 3x3, 0 for 1x1, on every side
        padding: Any = [[0, 0], [pad, pad], [pad, pad], [0, 0]] if pad else "VALID"
        return tf.nn.conv2d(x, w, strides=stride, padding=padding)

    def _bn(self, x: tf.Tensor, name: str, updates: list[tuple[str, tf.Tensor, tf.Tensor]] | None) -> tf.Tensor:
        """Training mode when ``updates`` collects the batch statistics; evaluation mode when None."""
        gamma, beta = self.params[f"{name}.weight"], self.params[f"{name}.bias"]
        if updates is None:
            return tf.nn.batch_normalization(x, self.stats[f"{name}.running_mean"], self.stats[f"{name}.running_var"],
                                             beta, gamma, BN_EPS)
        out, mean, var = batch_norm_train(x, gamma, beta)
        updates.append((name, mean, var))
        return out

    def _block(self, x: tf.Tensor, prefix: str, stride: int, project: bool,
               updates: list[tuple[str, tf.Tensor, tf.Tensor]] | None) -> tf.Tensor:
        shortcut = self._bn(self._conv(x, f"{prefix}.shortcut.0", stride), f"{prefix}.shortcut.1", updates) \
            if project else x
        if self.version == 1:   # conv-BN-ReLU-conv-BN, add, ReLU
            out = tf.nn.relu(self._bn(self._conv(x, f"{prefix}.conv1", stride), f"{prefix}.bn1", updates))
            out = self._bn(self._conv(out, f"{prefix}.conv2", 1), f"{prefix}.bn2", updates)
            return tf.nn.relu(out + shortcut)
        # v2: BN-ReLU-conv-BN-ReLU-conv, add (the shortcut sees the raw input)
        out = self._conv(tf.nn.relu(self._bn(x, f"{prefix}.bn1", updates)), f"{prefix}.conv1", stride)
        out = self._conv(tf.nn.relu(self._bn(out, f"{prefix}.bn2", updates)), f"{prefix}.conv2", 1)
        return out + shortcut

    def _logits(self, x_nchw: tf.Tensor, updates: list[tuple[str, tf.Tensor, tf.Tensor]] | None) -> tf.Tensor:
        x = tf.transpose(x_nchw, [0, 2, 3, 1])
        x = tf.nn.relu(self._bn(self._conv(x, "stem.0", 1), "stem.1", updates))
        in_channels = STAGE_CHANNELS[0]
        for stage, channels in enumerate(STAGE_CHANNELS):
            for block in range((self.depth - 2) // 6):
                stride = 2 if stage > 0 and block == 0 else 1
                x = self._block(x, f"stages.{stage}.{block}", stride,
                                stride != 1 or in_channels != channels, updates)
                in_channels = channels
        pooled = tf.reduce_mean(x, axis=[1, 2])
        return tf.matmul(pooled, self.params["classifier.weight"]) + self.params["classifier.bias"]

    def _l2(self) -> tf.Tensor:
        return 0.5 * self.settings.l2 * tf.add_n([tf.reduce_sum(w * w) for w in self._decayed])

    # -- the step -------------------------------------------------------------------------------
    def _local_step(self, x: tf.Tensor, y: tf.Tensor, lr: tf.Tensor) -> tf.Tensor:
        s = self.settings
        updates: list[tuple[str, tf.Tensor, tf.Tensor]] = []
        with tf.GradientTape() as tape:
            logits = self._logits(x, updates)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
            if s.l2:
                loss = loss + self._l2()
        grads = mean_over_processes(tape.gradient(loss, self._trainable), self.strategy, self.device)
        for name, mean, var in updates:   # the running statistics of this process's batch
            running_update(self.stats[f"{name}.running_mean"], mean)
            running_update(self.stats[f"{name}.running_var"], var)
        sgd_update(self._trainable, grads, self.buffers, s, lr)
        return loss

    def _distributed_step(self, x: tf.Tensor, y: tf.Tensor, lr: tf.Tensor) -> tf.Tensor:
        return on_every_replica(self.strategy, self._local_step, x, y, lr)

    def step(self, x: np.ndarray, y: np.ndarray, lr: float) -> float:
        """One synchronous step on this process's minibatch (``x`` float32 NCHW, as mlbench's
        pipeline makes it; ``y`` class indices); returns this process's loss (with the L2 term)."""
        return float(self._step(tf.constant(x, self.dtype), tf.constant(y, tf.int64), tf.constant(lr, self.dtype)))

    def warm_up(self, x: np.ndarray, y: np.ndarray) -> None:
        """Trace and run :meth:`step` once for minibatches shaped as ``x``, ``y``, then put back
        the parameters, the running statistics and the momentum buffers as they were (bit for bit)."""
        restore_after(lambda: self.step(x, y, 0.0), [*self.params.values(), *self.stats.values(), *self.buffers])

    # -- evaluation -----------------------------------------------------------------------------
    def logits(self, x: np.ndarray) -> np.ndarray:
        """The logits ``[N, classes]`` of NCHW ``x`` in evaluation mode (the running statistics),
        with this process's copy of the model (no collective)."""
        return self._forward(tf.constant(x, self.dtype)).numpy()

    def _local_average(self) -> None:
        stats = list(self.stats.values())
        with tf.device(self.device):
            values = [tf.identity(v) for v in stats]
        averaged = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.MEAN, values)
        for v, a in zip(stats, averaged):
            v.assign(a)

    def _distributed_average(self) -> None:
        self.strategy.run(self._local_average)

    def sync_statistics(self) -> None:
        """:meth:`average_running_stats`, under the name the port trainer calls
        (:class:`mlbench.worker.port_trainer.PortModel`)."""
        self.average_running_stats()

    def average_running_stats(self) -> None:
        """Average the BatchNorm running statistics over the processes (a collective: every
        process calls it, before each evaluation), as the PyTorch runtime does: each process's
        come from its own minibatches, and the evaluated model must be one model. They stay
        averaged for the training that follows, as PyTorch's do. One process: nothing to do."""
        if self.strategy is not None:
            self._average()

    def weights(self) -> np.ndarray:
        """This process's trainable parameters, flat, in PyTorch's ``parameters()`` order and
        layouts (every process holds the same)."""
        return np.concatenate([v.reshape(-1) for k, v in self.state_dict().items() if k in self.params])

    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameters and running statistics under PyTorch's names and in its layouts (what
        ``ResNetCIFAR.load_state_dict`` takes, less ``num_batches_tracked``), in its order."""
        out: dict[str, np.ndarray] = {}
        variables = {**self.params, **self.stats}
        for name, v in sorted(variables.items(), key=lambda item: self.order.index(item[0])):
            value = v.numpy()
            if value.ndim == 4:
                value = value.transpose(3, 2, 0, 1)   # HWIO -> OIHW
            elif value.ndim == 2:
                value = value.T
            out[name] = value
        return out

    def regulariser(self) -> float:
        """l2/2 of the squares of the parameters named ``weight``, in float64 (mlbench's
        regulariser, :func:`mlbench.tasks.losses.regulariser`; 0 for task 1a)."""
        if not self.settings.l2:
            return 0.0
        return 0.5 * self.settings.l2 * sum(float(np.sum(v.numpy().astype(np.float64) ** 2)) for v in self._decayed)

    @property
    def num_parameters(self) -> int:
        return int(sum(int(np.prod(v.shape)) for v in self._trainable))


def make_port(settings: ClassificationSettings, in_features: int,
              reference_state: Callable[[], dict[str, np.ndarray]], strategy: Any = None) -> ResNetPort:
    """Task 1a's TensorFlow port (:meth:`mlbench.frameworks.Framework.port_module`): the ResNet
    of the run's settings, from the PyTorch model's weights for the run's seed
    (``reference_state``), in the run's ``strategy``."""
    return ResNetPort(settings, *_layout(settings.model), reference_state(), strategy)


def _layout(model: str) -> tuple[int, int]:
    """The depth and version of the ResNet ``model`` names; a port builds only ResNets."""
    from mlbench.errors import UsageError
    from mlbench.tasks.models import resnet_layout

    layout = resnet_layout(model)
    if layout is None:
        raise UsageError(f"task1a's port builds mlbench's ResNets (resnet20-v1, ...), not {model}", option="set")
    return layout

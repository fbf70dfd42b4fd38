"""The runtime of the classification tasks (1a: ResNet on CIFAR-10; 2a: logistic regression on
epsilon): minibatches gathered by index from tensors, one forward and backward pass per step,
top-1 accuracy on the test set.

Everything task-specific comes from the names in the settings: the data set
(:mod:`mlbench.tasks.datasets`), the model (:mod:`mlbench.tasks.models`), the loss
(:mod:`mlbench.tasks.losses`) and the learning-rate rule (:mod:`mlbench.tasks.classification`). A loss with a
closed-form gradient (logistic regression) skips autograd when the optimizer does not wrap the
model (docs/tasks.md, task 2a).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from mlbench.errors import UsageError
from mlbench.tasks.classification import ClassificationSettings, learning_rate
from mlbench.tasks.data.sharding import epoch_batches, eval_shard, steps_per_epoch
from mlbench.tasks.datasets import get_dataset, load_splits, make_synthetic_before_fork
from mlbench.tasks.flops import (ANALYTIC, FLOP_COUNTER, counted_flops, logistic_regression_flops,
                                 preload_flop_counter)
from mlbench.tasks.losses import get_loss, regulariser
from mlbench.tasks.models import build_model
from mlbench.tasks.task2a.model import LogisticRegression
from mlbench.tasks.models.plugins import build_plugin_model
from mlbench.tasks.pipeline import Pipeline
from mlbench.tasks.runtime import RunView, StepOptimizer, all_reduce_sum
from mlbench.tasks.scoring import TOTALS, metrics_of, score_outputs
from mlbench.timing import PhaseTimer


#: The classes of the cross-entropy tasks' data sets (CIFAR-10), the built-in models' default.
NUM_CLASSES = 10


class SupervisedRuntime:
    """Classification on one worker: the shard of each global minibatch, the step, evaluation."""

    metric_name = "accuracy"

    def __init__(self, config: RunView, rank: int, device: torch.device, timer: PhaseTimer,
                 model_builder: Callable[..., Any] | None = None):
        self.cfg = config
        settings = config.training_spec.settings
        assert isinstance(settings, ClassificationSettings)
        self.settings = settings
        self.rank = rank
        self.world = config.workers
        self.device = device
        self.timer = timer
        dataset = get_dataset(self.settings.dataset)
        train, test = load_splits(self.settings.dataset, config.data, config.data_dir, config.seed)
        self.data = Pipeline(train, test, device, images=dataset.images,
                             channels_last=config.channels_last)
        # Every rank builds the model from the same seed, so all start from the same weights.
        torch.manual_seed(config.seed)
        in_features = None if dataset.images else self.data.num_features
        self.loss = get_loss(self.settings.loss)
        if model_builder is None:
            self.model = build_model(self.settings.model, in_features=in_features).to(device)
        else:  # a model plug-in (mlbench.tasks.models.plugins): the settings' model is its label
            self.model = self._plugin_model(model_builder).to(device)
        if config.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self._steps_per_epoch = steps_per_epoch(self.data.num_train, self.world, self.settings.batch_per_worker)
        if self._steps_per_epoch == 0:
            raise UsageError(f"the training set has {self.data.num_train} samples, fewer than one "
                             f"global batch ({self.world} workers x {self.settings.batch_per_worker})")
        self._step: Callable[[torch.Tensor, float], torch.Tensor] | None = None
        self._optimizer: StepOptimizer | None = None

    def _plugin_model(self, builder: Callable[..., Any]) -> torch.nn.Module:
        """``builder(input_shape, num_outputs)``: one sample's shape as the model sees it, and the
        outputs the loss reads per sample (one logit for the logistic loss, whose output is
        ``[N]``; a logit per class for cross-entropy, ``[N, classes]``)."""
        x, _ = self.data.test_batch(0, 1)
        input_shape = tuple(int(n) for n in x.shape[1:])
        logistic = self.settings.loss == "logistic"
        outputs = 1 if logistic else NUM_CLASSES

        def shape(n: int) -> tuple[int, ...]:
            return (n,) if logistic else (n, NUM_CLASSES)
        return build_plugin_model(builder, self.settings.model, input_shape, outputs, shape)

    # -- training -------------------------------------------------------------------------------
    def steps_per_epoch(self) -> int:
        return self._steps_per_epoch

    def begin_epoch(self, epoch: int) -> None:
        self.data.begin_epoch(self.cfg.seed, epoch)

    def batches(self, epoch: int) -> Iterator[torch.Tensor]:
        indices = epoch_batches(self.data.num_train, workers=self.world, rank=self.rank,
                                batch_per_worker=self.settings.batch_per_worker, seed=self.cfg.seed,
                                epoch=epoch).to(self.device)
        return iter(indices)

    def lr(self, step: int, batch: Any = None) -> float:
        return learning_rate(self.settings.lr, workers=self.world, batch_per_worker=self.settings.batch_per_worker,
                             step=step, steps_per_epoch=self._steps_per_epoch)

    def samples_in(self, batch: torch.Tensor) -> int:
        return int(batch.shape[0])

    def train_step(self, batch: torch.Tensor, lr: float, optimizer: StepOptimizer) -> torch.Tensor:
        if self._step is None or optimizer is not self._optimizer:
            self._optimizer = optimizer
            self._step = self._make_step(optimizer)
        return self._step(batch, lr)

    def _make_step(self, optimizer: StepOptimizer) -> Callable[[torch.Tensor, float], torch.Tensor]:
        """The optimizer's whole step around this task's gradients (captured in a CUDA graph
        when the optimizer can and the run allows it)."""
        # the closed form reads the built-in LogisticRegression's weight: a plug-in's model
        # that is another module goes through autograd
        closed_form = (self.loss.closed_form is not None and optimizer.module is self.model
                       and type(self.model) is LogisticRegression)
        gradients = self._closed_form_gradients if closed_form else self._autograd_gradients
        make_step = getattr(optimizer, "make_step", None)
        if make_step is None:  # an optimizer without a step of its own: the textbook step
            def step(idx: torch.Tensor, lr: float) -> torch.Tensor:
                self.timer.begin()
                optimizer.zero_grad()
                loss = gradients(idx)
                optimizer.step(lr)
                return loss
            return step
        capture = None
        if self._can_capture():
            capture = torch.zeros(self.settings.batch_per_worker, dtype=torch.long, device=self.device)
        return make_step(gradients, capture=capture, state=self.model.state_dict)

    def _can_capture(self) -> bool:
        """CUDA graphs need a GPU and a backend whose collectives can be captured (NCCL)."""
        return (self.cfg.graph and self.device.type == "cuda"
                and (self.world == 1 or self.cfg.backend == "nccl"))

    def _autograd_gradients(self, idx: torch.Tensor) -> torch.Tensor:
        x, y = self.data.train_batch(idx)
        self.timer.mark("data")
        module = self._optimizer.module if self._optimizer is not None else self.model
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16,
                            enabled=self.cfg.precision == "bf16"):
            output = module(x)
            loss = self.loss.value(output, y, "mean")
        objective = loss + regulariser(self.model, self.settings.l2)
        self.timer.mark("forward")
        objective.backward()
        self.timer.mark("backward")
        return objective.detach()

    @torch.no_grad()
    def _closed_form_gradients(self, idx: torch.Tensor) -> torch.Tensor:
        x, y = self.data.train_batch(idx)
        self.timer.mark("data")
        for p in self.model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        assert self.loss.closed_form is not None
        loss = self.loss.closed_form(self.model, x, y, self.settings.l2)
        self.timer.mark("forward")
        self.timer.mark("backward")
        return loss

    def flops_per_step(self) -> tuple[int, str]:
        """FLOPs of this worker's step and how they were counted (:mod:`mlbench.tasks.flops`)."""
        batch = self.settings.batch_per_worker
        if type(self.model) is LogisticRegression:
            return logistic_regression_flops(batch, self.model.in_features), ANALYTIC
        sample, _ = self.data.test_batch(0, 1)
        return counted_flops(self.model, sample, batch), FLOP_COUNTER

    def state_dict(self) -> dict[str, Any]:
        """Nothing beyond the model: the batches and the augmentation follow from (seed, epoch)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore (see :meth:`state_dict`)."""

    # -- evaluation ---------------------------------------------------------------------------
    def _sync_buffers(self) -> None:
        """Average the BatchNorm running statistics over workers before evaluating.

        Each worker's running mean/variance come from its own minibatches; averaging them (as
        DistributedDataParallel keeps buffers in sync) makes the evaluated model the same on every
        rank, so the all-reduced test metrics are those of one model.
        """
        if self.world == 1:
            return
        for buf in self.model.buffers():
            if buf.is_floating_point():
                dist.all_reduce(buf, op=dist.ReduceOp.SUM)
                buf.div_(self.world)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Loss (with the L2 term) and top-1 accuracy on the whole test set, over all workers.

        The model only computes the logits of this rank's share; mlbench's NumPy scorer
        (:mod:`mlbench.tasks.scoring`, the same for every framework) scores them."""
        self._sync_buffers()
        self.model.eval()
        start, stop = eval_shard(self.data.num_test, workers=self.world, rank=self.rank)
        totals = np.zeros(len(TOTALS), dtype=np.float64)
        for lo in range(start, stop, self.cfg.eval_batch_size):
            x, y = self.data.test_batch(lo, min(stop, lo + self.cfg.eval_batch_size))
            output = self.model(x)
            totals += score_outputs(self.settings.loss, output.float().cpu().numpy(), y.cpu().numpy())
        summed = all_reduce_sum(totals.tolist(), self.world, self.device)
        self.model.train()
        return metrics_of(summed, float(regulariser(self.model, self.settings.l2)))

    @property
    def train_samples(self) -> int:
        return self.data.num_train

    @property
    def test_samples(self) -> int:
        return self.data.num_test


def prepare_before_fork(config: RunView) -> None:
    """What the local supervisor calls once before it forks the ranks, so that each rank shares
    it instead of making it again: synthetic data, drawn here for all of them
    (:func:`mlbench.tasks.datasets.make_synthetic_before_fork`), and, for a model whose FLOPs
    are counted (every one but the built-in logistic regression: :meth:`SupervisedRuntime.flops_per_step`),
    the modules torch's flop counter imports on its first use
    (:func:`mlbench.tasks.flops.preload_flop_counter`: 1.3 CPU-seconds a rank saved)."""
    settings = config.training_spec.settings
    assert isinstance(settings, ClassificationSettings)
    if config.data == "synthetic":
        make_synthetic_before_fork(settings.dataset, config.seed)
    if settings.model.strip().lower() != "logreg":
        preload_flop_counter()


def build_runtime(config: RunView, rank: int, device: torch.device, timer: PhaseTimer,
                  model_builder: Callable[..., Any] | None = None) -> SupervisedRuntime:
    """What the worker calls for tasks 1a and 2a (``model_builder``: a model plug-in's)."""
    return SupervisedRuntime(config, rank, device, timer, model_builder)

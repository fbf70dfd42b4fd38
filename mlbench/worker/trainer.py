"""What one worker does: join the group, train on its shard, evaluate, check the goal, report.

The trainer is the same on a laptop and in a pod. It knows its rank, the run configuration and
an event writer; it does not know how it was started. Every worker runs the same loop in
lock-step (synchronous SGD), so decisions that end the loop are either computed from all-reduced
numbers (the goal) or agreed with a collective (the time budget): all workers stop together.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from mlbench.errors import UsageError
from mlbench.optim.base import OptimizerContext, allreduce_bytes, build_optimizer
from mlbench.optim.lr import learning_rate
from mlbench.results.events import EventWriter
from mlbench.tasks.data.sharding import epoch_batches, eval_shard, steps_per_epoch
from mlbench.tasks.losses import batch_loss, correct_count, regulariser
from mlbench.tasks.models import build_model, count_trainable_parameters
from mlbench.tasks.pipeline import Pipeline, load_splits
from mlbench.worker.config import RunConfig
from mlbench.worker.steps import ReferenceStep
from mlbench.worker.timing import PhaseTimer

#: Target seconds between two checks of the time budget (the workers agree on the step count).
BUDGET_CHECK_SECONDS = 0.25


@dataclass
class Progress:
    """Counters of the run so far, as one worker sees them."""

    step: int = 0
    epoch: int = 0
    train_start: float | None = None
    eval_time: float = 0.0
    best_accuracy: float | None = None
    last_accuracy: float | None = None
    last_loss: float | None = None
    goal_step: int | None = None
    goal_epoch: float | None = None
    goal_train_time: float | None = None
    goal_wall_time: float | None = None

    def train_time(self) -> float:
        """Seconds of training since the first step, evaluation excluded."""
        if self.train_start is None:
            return 0.0
        return time.perf_counter() - self.train_start - self.eval_time


class Trainer:
    def __init__(self, config: RunConfig, rank: int, events: EventWriter):
        self.cfg = config
        self.rank = rank
        self.world = config.workers
        self.events = events
        self.spec = config.task
        self.device = self._device()
        self.progress = Progress()
        self._next_budget_check = 0

    # -- setup ------------------------------------------------------------------------------
    def _device(self) -> torch.device:
        if self.cfg.device == "cuda":
            index = self.rank % max(1, torch.cuda.device_count())
            torch.cuda.set_device(index)
            return torch.device("cuda", index)
        return torch.device("cpu")

    def setup(self) -> None:
        torch.manual_seed(self.cfg.seed)
        train, test = load_splits(self.spec.dataset, self.cfg.data, self.cfg.data_dir, self.cfg.seed)
        images = self.spec.dataset == "cifar10"
        self.data = Pipeline(train, test, self.device, images=images,
                             channels_last=self.cfg.channels_last)
        in_features = None if images else self.data.num_features
        # Every rank builds the model from the same seed, so all start from the same weights.
        torch.manual_seed(self.cfg.seed)
        self.model = build_model(self.spec.model, in_features=in_features).to(self.device)
        if self.cfg.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.timer = PhaseTimer(self.device, enabled=self.cfg.timing)
        # What the reference (one fp32 all-reduce of all gradients) sends per step and rank: the
        # denominator of a compressing optimizer's compression ratio.
        self.dense_bytes_per_step = allreduce_bytes(count_trainable_parameters(self.model), 4, self.world)
        self.steps_per_epoch = steps_per_epoch(self.data.num_train, self.world,
                                               self.spec.batch_per_worker)
        self.fast: ReferenceStep | None = None
        if self._fast_path_applies(images):
            self.fast = ReferenceStep(self.model, self.spec, self.data, self.timer, self.world,
                                      capture=self._can_capture(), precision=self.cfg.precision)
            self.optimizer = self.fast
        else:
            ctx = OptimizerContext(model=self.model, spec=self.spec, world_size=self.world,
                                   rank=self.rank, timer=self.timer,
                                   options=dict(self.cfg.optimizer_options))
            self.optimizer = build_optimizer(self.cfg.optimizer, ctx)
        if self.steps_per_epoch == 0:
            raise UsageError(f"the training set has {self.data.num_train} samples, fewer than one "
                             f"global batch ({self.world} workers x {self.spec.batch_per_worker})")

    def _can_capture(self) -> bool:
        """CUDA graphs need a GPU and a backend whose collectives can be captured (NCCL)."""
        return (self.cfg.graph and self.device.type == "cuda"
                and (self.world == 1 or self.cfg.backend == "nccl"))

    def _fast_path_applies(self, images: bool) -> bool:
        """The reference optimizer (one flat all-reduce) runs as :class:`ReferenceStep` when that
        gains something: a captured CUDA graph, or task 2a's closed-form gradient."""
        reference = (self.cfg.optimizer == "centralized-sgd"
                     and self.cfg.optimizer_options.get("by", "model") == "model")
        closed_form = self.spec.loss == "logistic" and not images
        return reference and (self._can_capture() or closed_form)

    def lr_at(self, step: int) -> float:
        return learning_rate(self.spec.lr, workers=self.world,
                             batch_per_worker=self.spec.batch_per_worker, step=step,
                             steps_per_epoch=self.steps_per_epoch)

    # -- the loop -----------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        """Train until the goal, the epoch cap, the time budget or the step cap; return the result."""
        p = self.progress
        stop_reason = "max-epochs"
        evaluated_at = -1
        p.train_start = time.perf_counter()
        loss_sum = torch.zeros((), device=self.device)
        interval_steps = 0
        interval_start_bytes = 0
        for epoch in range(self.spec.max_epochs):
            p.epoch = epoch
            batches = epoch_batches(self.data.num_train, workers=self.world, rank=self.rank,
                                    batch_per_worker=self.spec.batch_per_worker,
                                    seed=self.cfg.seed, epoch=epoch).to(self.device)
            self.data.begin_epoch(self.cfg.seed, epoch)
            stop = None
            for local_step in range(batches.shape[0]):
                if self.cfg.max_steps is not None and p.step >= self.cfg.max_steps:
                    stop = "max-steps"
                    break
                if (self.cfg.time_budget_s is not None and p.step >= self._next_budget_check
                        and self._budget_spent()):
                    stop = "time-budget"
                    break
                loss_sum += self.train_step(batches[local_step], self.lr_at(p.step))
                p.step += 1
                interval_steps += 1
                if interval_steps == self.cfg.log_every:
                    self._log_interval(loss_sum, interval_steps, interval_start_bytes)
                    loss_sum.zero_()
                    interval_steps = 0
                    interval_start_bytes = self.optimizer.bytes_sent
            if interval_steps:
                self._log_interval(loss_sum, interval_steps, interval_start_bytes)
                loss_sum.zero_()
                interval_steps = 0
                interval_start_bytes = self.optimizer.bytes_sent
            if stop is not None and evaluated_at == p.step:
                stop_reason = stop  # at an epoch's first step: the model was evaluated already
                break
            reached = self.evaluate()
            evaluated_at = p.step
            if stop is not None:
                stop_reason = stop
                break
            if reached and self.cfg.stop_at_goal:
                stop_reason = "goal"
                break
        if evaluated_at != p.step:
            self.evaluate()
        return self._result(stop_reason)

    def train_step(self, idx: torch.Tensor, lr: float) -> torch.Tensor:
        """One synchronous SGD step; returns the minibatch loss (a device tensor, not synced)."""
        if self.fast is not None:
            return self.fast(idx, lr)
        self.timer.begin()
        x, y = self.data.train_batch(idx)
        self.timer.mark("data")
        output = self.optimizer.module(x)  # the model, or a wrapper such as DDP's
        loss = batch_loss(self.spec.loss, output, y)
        objective = loss + regulariser(self.model, self.spec.l2)
        self.timer.mark("forward")
        self.optimizer.zero_grad()
        objective.backward()
        self.timer.mark("backward")
        self.optimizer.step(lr)
        return objective.detach()

    def _budget_spent(self) -> bool:
        """All workers agree on whether the training-time budget is spent, and on the next check.

        One small all-reduce (MAX) carries "spent?" and minus each worker's proposal of how many
        steps to wait until the next check (about BUDGET_CHECK_SECONDS of training), so the
        slowest worker's pace sets the interval and the overshoot stays a fraction of a second
        without a collective on every step.
        """
        p = self.progress
        elapsed = p.train_time()
        per_step = elapsed / p.step if p.step else 0.0
        proposal = max(1, min(1000, int(BUDGET_CHECK_SECONDS / per_step))) if per_step > 0 else 1
        flags = torch.tensor([1.0 if elapsed >= self.cfg.time_budget_s else 0.0, -float(proposal)],
                             device=self.device)
        if self.world > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        spent, interval = flags.tolist()
        self._next_budget_check = p.step + int(-interval)
        return spent > 0

    def _epoch_float(self) -> float:
        return self.progress.step / self.steps_per_epoch

    def _log_interval(self, loss_sum: torch.Tensor, steps: int, start_bytes: int) -> None:
        p = self.progress
        epoch, step = self._epoch_float(), p.step
        emit = self.events.emit
        emit("train/loss", float(loss_sum.item()) / steps, epoch=epoch, step=step)
        emit("train/lr", self.lr_at(max(0, step - 1)), epoch=epoch, step=step)
        emit("train/steps", steps, epoch=epoch, step=step)
        emit("train/samples", steps * self.spec.batch_per_worker, epoch=epoch, step=step)
        emit("train/time", p.train_time(), epoch=epoch, step=step)
        for phase, seconds in self.timer.collect().items():
            emit(f"time/{phase}", seconds, epoch=epoch, step=step)
        emit("comm/bytes", self.optimizer.bytes_sent - start_bytes, epoch=epoch, step=step)
        emit("comm/dense_bytes", steps * self.dense_bytes_per_step, epoch=epoch, step=step)

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
    def evaluate(self) -> bool:
        """Loss and accuracy on the whole test set (all-reduced); True when the goal is reached."""
        p = self.progress
        begin = time.perf_counter()
        restore = self.optimizer.state_for_eval()
        self._sync_buffers()
        self.model.eval()
        start, stop = eval_shard(self.data.num_test, workers=self.world, rank=self.rank)
        totals = torch.zeros(3, dtype=torch.float64, device=self.device)
        for lo in range(start, stop, self.cfg.eval_batch_size):
            x, y = self.data.test_batch(lo, min(stop, lo + self.cfg.eval_batch_size))
            output = self.model(x)
            totals[0] += batch_loss(self.spec.loss, output, y, reduction="sum").double()
            totals[1] += correct_count(self.spec.loss, output, y).double()
            totals[2] += y.shape[0]
        if self.world > 1:
            dist.all_reduce(totals, op=dist.ReduceOp.SUM)
        self.model.train()
        loss = float(totals[0] / totals[2]) + float(regulariser(self.model, self.spec.l2))
        if restore is not None:  # e.g. gossip: each rank goes on training its own model
            restore()
        accuracy = float(totals[1] / totals[2])
        elapsed = time.perf_counter() - begin
        p.eval_time += elapsed
        epoch, step = self._epoch_float(), p.step
        self.events.emit("time/eval", elapsed, epoch=epoch, step=step)
        p.last_loss, p.last_accuracy = loss, accuracy
        p.best_accuracy = accuracy if p.best_accuracy is None else max(p.best_accuracy, accuracy)
        if self.rank == 0:
            self.events.emit("eval/loss", loss, epoch=epoch, step=step)
            self.events.emit("eval/accuracy", accuracy, epoch=epoch, step=step)
            self.events.emit("train/time", p.train_time(), epoch=epoch, step=step)
        goal = self.cfg.goal
        reached = goal is not None and accuracy >= goal
        if reached and p.goal_step is None:
            p.goal_step, p.goal_epoch = step, epoch
            p.goal_train_time = p.train_time()
            p.goal_wall_time = time.perf_counter() - p.train_start
        return reached

    def _result(self, stop_reason: str) -> dict[str, Any]:
        p = self.progress
        return {
            "goal": self.cfg.goal,
            "light": self.cfg.light,
            "reached": p.goal_step is not None,
            "time_to_accuracy": p.goal_train_time,
            "wall_time_to_accuracy": p.goal_wall_time,
            "epochs_to_accuracy": p.goal_epoch,
            "steps_to_accuracy": p.goal_step,
            "final_accuracy": p.last_accuracy,
            "final_loss": p.last_loss,
            "best_accuracy": p.best_accuracy,
            "train_time": p.train_time(),
            "eval_time": p.eval_time,
            "epochs": self._epoch_float(),
            "steps": p.step,
            "stop_reason": stop_reason,
            "bytes_sent": self.optimizer.bytes_sent,
            "train_samples": self.data.num_train,
            "test_samples": self.data.num_test,
        }


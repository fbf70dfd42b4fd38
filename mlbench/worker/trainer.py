"""What one worker does: join the group, train on its shard, evaluate, check the goal, report.

The trainer is the same on a laptop and in a pod. It knows its rank, the run configuration and
an event writer; it does not know how it was started. Every worker runs the same loop in
lock-step (synchronous SGD), so decisions that end the loop are either computed from all-reduced
numbers (the goal) or agreed with a collective (the time budget): all workers stop together.

A run whose loss or parameters stop being finite has failed, whatever its accuracy afterwards
(a NaN model may still "score" 50% on a balanced test set). The check costs no device sync of
its own: every step's loss is copied into a small device buffer, and the buffer's and the
parameters' finiteness is read with the loss that is read anyway at each log interval, so the
worker names the exact step even though it looks only every ``log_every`` steps. Gradients are
not checked: fp16 loss scaling (task 4b) makes inf gradients on purpose and skips those steps,
and any other non-finite gradient shows in the parameters after the step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


import torch
import torch.distributed as dist

from mlbench.errors import DivergedError
from mlbench.optim.base import DistributedOptimizer, OptimizerContext, allreduce_bytes
from mlbench.optim.catalog import build_optimizer
from mlbench.plugins import PluginError
from mlbench.results.events import EventWriter
from mlbench.results.outcome import TrainingResult
from mlbench.run_config import RunConfig
from mlbench.tasks.metrics import get_metric
from mlbench.tasks.models import count_trainable_parameters
from mlbench.tasks.models.plugins import load_recorded_model
from mlbench.tasks.registry import runtime_module
from mlbench.tasks.runtime import TaskRuntime
from mlbench.timing import PhaseTimer
from mlbench.worker.heartbeat import Heartbeat

#: Target seconds between two checks of the time budget (the workers agree on the step count).
BUDGET_CHECK_SECONDS = 0.25


@dataclass
class Progress:
    """Counters of the run so far, as one worker sees them."""

    step: int = 0
    epoch: int = 0
    train_start: float | None = None
    eval_time: float = 0.0
    best_value: float | None = None      # of the task's goal metric (accuracy, perplexity, BLEU)
    last_value: float | None = None
    last_loss: float | None = None
    last_lr: float = 0.0
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
    def __init__(self, config: RunConfig, rank: int, events: EventWriter, heartbeat: Heartbeat | None = None,
                 run_dir: Path | None = None):
        self.cfg = config
        self.run_dir = run_dir  # where a plug-in's source is
        self.heartbeat = heartbeat
        self.rank = rank
        self.world = config.workers
        self.events = events
        self.spec = config.training_spec
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
        self.timer = PhaseTimer(self.device, enabled=self.cfg.timing)
        plugin = self.cfg.model_plugin
        extra: dict[str, Any] = {}
        if plugin is not None:   # a model plug-in, made from the run folder's copy of its source
            if self.run_dir is None:
                raise PluginError(f"model plug-in {plugin.get('name')}: this worker has no run folder to load it from")
            extra["model_builder"] = load_recorded_model(self.run_dir, plugin)
        self.runtime: TaskRuntime = runtime_module(self.spec).build_runtime(self.cfg, self.rank, self.device,
                                                                             self.timer, **extra)
        self.model = self.runtime.model
        self.metric = get_metric(self.runtime.metric_name)
        # What the reference (one fp32 all-reduce of all gradients) sends per step and rank: the
        # denominator of a compressing optimizer's compression ratio.
        self.dense_bytes_per_step = allreduce_bytes(count_trainable_parameters(self.model), 4, self.world)
        self.steps_per_epoch = self.runtime.steps_per_epoch()
        ctx = OptimizerContext(model=self.model, spec=self.spec, world_size=self.world,
                               rank=self.rank, timer=self.timer,
                               options=dict(self.cfg.optimizer_options))
        self.optimizer: DistributedOptimizer = build_optimizer(self.cfg.optimizer, ctx, self.cfg.optimizer_plugin,
                                                                self.run_dir)

    # -- the loop -----------------------------------------------------------------------------
    def train(self) -> TrainingResult:
        """Train until the goal, the epoch cap, the time budget or the step cap; return the result."""
        p = self.progress
        stop_reason = "max-epochs"
        evaluated_at = -1
        p.train_start = time.perf_counter()
        loss_sum = torch.zeros((), device=self.device)
        losses = torch.zeros(self.cfg.log_every, device=self.device)  # this interval's, per step
        interval_steps = interval_samples = 0
        interval_start_bytes = 0
        for epoch in range(self.spec.settings.max_epochs):
            p.epoch = epoch
            self.runtime.begin_epoch(epoch)
            stop = None
            for batch in self.runtime.batches(epoch):
                if self.cfg.max_steps is not None and p.step >= self.cfg.max_steps:
                    stop = "max-steps"
                    break
                if (self.cfg.time_budget_s is not None and p.step >= self._next_budget_check
                        and self._budget_spent()):
                    stop = "time-budget"
                    break
                lr = self.runtime.lr(p.step, batch)
                loss = self.runtime.train_step(batch, lr, self.optimizer)
                loss_sum += loss
                losses[interval_steps] = loss
                p.last_lr = lr
                p.step += 1
                if self.heartbeat is not None:
                    self.heartbeat.stepped(p.step)
                interval_steps += 1
                interval_samples += self.runtime.samples_in(batch)
                if interval_steps == self.cfg.log_every:
                    self._log_interval(loss_sum, losses, interval_steps, interval_samples, interval_start_bytes)
                    loss_sum.zero_()
                    interval_steps = interval_samples = 0
                    interval_start_bytes = self.optimizer.bytes_sent
            if interval_steps:
                self._log_interval(loss_sum, losses, interval_steps, interval_samples, interval_start_bytes)
                loss_sum.zero_()
                interval_steps = interval_samples = 0
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
        budget = self.cfg.time_budget_s
        assert budget is not None
        flags = torch.tensor([1.0 if elapsed >= budget else 0.0, -float(proposal)],
                             device=self.device)
        if self.world > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        spent, interval = flags.tolist()
        self._next_budget_check = p.step + int(-interval)
        return spent > 0

    def _epoch_float(self) -> float:
        return self.progress.step / self.steps_per_epoch

    def _log_interval(self, loss_sum: torch.Tensor, losses: torch.Tensor, steps: int, samples: int,
                      start_bytes: int) -> None:
        p = self.progress
        epoch, step = self._epoch_float(), p.step
        total = self._check_finite(loss_sum, losses[:steps])
        emit = self.events.emit
        emit("train/loss", total / steps, epoch=epoch, step=step)
        emit("train/lr", p.last_lr, epoch=epoch, step=step)
        emit("train/steps", steps, epoch=epoch, step=step)
        emit("train/samples", samples, epoch=epoch, step=step)
        emit("train/time", p.train_time(), epoch=epoch, step=step)
        for phase, seconds in self.timer.collect().items():
            emit(f"time/{phase}", seconds, epoch=epoch, step=step)
        emit("comm/bytes", self.optimizer.bytes_sent - start_bytes, epoch=epoch, step=step)
        emit("comm/dense_bytes", steps * self.dense_bytes_per_step, epoch=epoch, step=step)

    def _check_finite(self, loss_sum: torch.Tensor, losses: torch.Tensor) -> float:
        """The interval's loss sum, read in the same device sync as whether each of its step
        losses and the parameters after its last step are finite; raises DivergedError naming
        the first step (counted from 1, as the events count) whose loss is not."""
        p = self.progress
        bad = ~torch.isfinite(losses)
        first_bad = torch.where(bad.any(), bad.float().argmax(), -1.0)
        params_ok = torch.stack([torch.isfinite(q).all() for q in self.model.parameters()]).all()
        total, first, ok = torch.stack([loss_sum.float(), first_bad.float(), params_ok.float()]).tolist()
        if first >= 0:
            at = p.step - losses.numel() + int(first) + 1
            raise DivergedError(
                f"the training loss of rank {self.rank} is {losses[int(first)].item()} at step {at} "
                f"(epoch {at / self.steps_per_epoch:.2f}); the run diverged, so its results would mean "
                "nothing: lower the learning rate (--set lr...) or check the data")
        if not ok:
            raise DivergedError(
                f"the model's parameters on rank {self.rank} are not finite after step {p.step} (every loss "
                "up to it was); the run diverged, so its results would mean nothing: lower the learning rate "
                "(--set lr...) or check the data")
        return total

    # -- evaluation ---------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> bool:
        """The task's metrics on its evaluation set (over all workers); True at the goal."""
        p = self.progress
        begin = time.perf_counter()
        if self.heartbeat is not None:
            self.heartbeat.phase("evaluation")
        restore = self.optimizer.state_for_eval()
        metrics = self.runtime.evaluate()
        if restore is not None:  # e.g. gossip: each rank goes on training its own model
            restore()
        value = metrics[self.metric.name]
        elapsed = time.perf_counter() - begin
        p.eval_time += elapsed
        epoch, step = self._epoch_float(), p.step
        self.events.emit("time/eval", elapsed, epoch=epoch, step=step)
        p.last_loss, p.last_value = metrics["loss"], value
        p.best_value = self.metric.best([v for v in (p.best_value, value) if v is not None])
        if self.rank == 0:
            for name, number in metrics.items():
                self.events.emit(f"eval/{name}", number, epoch=epoch, step=step)
            self.events.emit("train/time", p.train_time(), epoch=epoch, step=step)
        if self.heartbeat is not None:
            self.heartbeat.phase("training")
        goal = self.cfg.goal
        reached = self.metric.reached(value, goal)
        if reached and p.goal_step is None:
            p.goal_step, p.goal_epoch = step, epoch
            p.goal_train_time = p.train_time()
            p.goal_wall_time = time.perf_counter() - (p.train_start or 0.0)
        return reached

    def _result(self, stop_reason: str) -> TrainingResult:
        p = self.progress
        return TrainingResult(
            goal=self.cfg.goal, light=self.cfg.light, reached=p.goal_step is not None,
            metric=self.metric.name, time_to_accuracy=p.goal_train_time,
            wall_time_to_accuracy=p.goal_wall_time, epochs_to_accuracy=p.goal_epoch,
            steps_to_accuracy=p.goal_step, final_accuracy=p.last_value, final_loss=p.last_loss,
            best_accuracy=p.best_value, train_time=p.train_time(), eval_time=p.eval_time,
            epochs=self._epoch_float(), steps=p.step, stop_reason=stop_reason,
            bytes_sent=self.optimizer.bytes_sent,
            train_samples=getattr(self.runtime, "train_samples", None),
            test_samples=getattr(self.runtime, "test_samples", None))


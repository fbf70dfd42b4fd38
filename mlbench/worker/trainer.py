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

import dataclasses
import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


import torch
import torch.distributed as dist

from mlbench.checkpoint_schedule import daly_interval, steps_between_checks
from mlbench.errors import DivergedError
from mlbench.optim.base import DistributedOptimizer, OptimizerContext, allreduce_bytes, collectives_issued, local_part
from mlbench.optim.catalog import build_optimizer
from mlbench.plugins import PluginError
from mlbench.results.events import EventWriter
from mlbench.results.checkpoints import checkpoint_root
from mlbench.results.outcome import TrainingResult
from mlbench.run_config import RunConfig
from mlbench.tasks.metrics import get_metric
from mlbench.tasks.models import count_trainable_parameters
from mlbench.tasks.models.plugins import load_recorded_model
from mlbench.tasks.registry import runtime_module
from mlbench.tasks.runtime import TaskRuntime
from mlbench.timing import PhaseTimer
from mlbench.worker import checkpoint
from mlbench.worker.heartbeat import Heartbeat
from mlbench.worker.hyper import task_hyper
from mlbench.worker.straggler import Straggler
from mlbench.worker.sysmetrics import DevicePeak, IntervalSampler, system_record

#: Why the loop ended, for the stops after which a checkpoint is written.
CHECKPOINTED_STOPS = ("max-steps", "time-budget", "stopped")


class Stopped(Exception):
    """The workers agreed to stop on a request (SIGTERM: Ctrl-C or a cancel) and wrote their
    checkpoint: the worker exits as stopped (143)."""


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

    def to_checkpoint(self) -> dict[str, Any]:
        """The counters as plain values (the training time so far in place of its start)."""
        data = dataclasses.asdict(self)
        del data["train_start"]
        data["train_time"] = self.train_time()
        return data

    @classmethod
    def from_checkpoint(cls, data: dict[str, Any]) -> Progress:
        """The counters of :meth:`to_checkpoint`, their clock going on from now."""
        fields = {f.name for f in dataclasses.fields(cls)} - {"train_start"}
        progress = cls(**{k: v for k, v in data.items() if k in fields})
        progress.train_start = time.perf_counter() - float(data["train_time"]) - progress.eval_time
        return progress


def resumed_batch(batch: int, written_by: int, world: int) -> int:
    """Where in its epoch a resumed group starts: batch ``batch`` of a checkpoint written by
    ``written_by`` workers. At the same size, that very batch. After a shrink (docs/faults.md),
    the epoch's permutation is the same and ``batch * written_by`` per-worker batches of it were
    used; the survivors start at the first of their (larger) global batches that holds none of
    them, so no sample is seen twice in the epoch and fewer than one new global batch is skipped."""
    if written_by == world:
        return batch
    return -(-batch * written_by // world)


class Trainer:
    def __init__(self, config: RunConfig, rank: int, events: EventWriter, heartbeat: Heartbeat | None = None,
                 run_dir: Path | None = None, stop_requested: Callable[[], bool] | None = None):
        self.cfg = config
        self.run_dir = run_dir  # where a plug-in's source is, and the checkpoints by default
        self.heartbeat = heartbeat
        self.rank = rank
        self.world = config.workers
        self.events = events
        self.spec = config.training_spec
        self.device = self._device()
        self.progress = Progress()
        self._next_budget_check = 0
        # a clean stop asked for from outside (the worker's SIGTERM), agreed at the clock checks
        self.stop_requested = stop_requested or (lambda: False)
        self._resume: dict[str, Any] | None = None
        self._checkpointed_at = -1      # the step of the last checkpoint written or read
        self._checkpoint_clock = 0.0    # perf_counter() of it
        # --checkpoint-every DURATION, or auto's (Young/Daly's) interval: the first checkpoint at
        # the first clock check, then from the median cost of those written so far
        self._every_s = 0.0 if config.checkpoint_auto_mtbf_s is not None else config.checkpoint_every_s
        self._checkpoint_costs: list[float] = []
        self.straggler = Straggler.of(config.faults, rank)   # --inject slow: this rank slowed

    @property
    def checkpoint_root(self) -> Path:
        """Where this run's resumable checkpoints go."""
        if self.run_dir is None:
            raise PluginError("this worker has no run folder to write its checkpoints to")
        return checkpoint_root(self.run_dir, self.cfg.checkpoint_dir)

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
        #: collectives the steps of this logging interval issued (None: torch does not count them)
        self._collectives: int | None = None
        self.steps_per_epoch = self.runtime.steps_per_epoch()
        # the step at which the current epoch's first batch was (or would have been) taken, by
        # this group: the epochs a run reports count its epochs trained, also after a shrink,
        # when the steps of an epoch change with the group's size (_epoch_float)
        self._epoch_began = 0
        ctx = OptimizerContext(model=self.model, hyper=task_hyper(self.spec, self.world), world_size=self.world,
                               rank=self.rank, timer=self.timer,
                               options=dict(self.cfg.optimizer_options))
        self.optimizer: DistributedOptimizer = build_optimizer(self.cfg.optimizer, ctx, self.cfg.optimizer_plugin,
                                                                self.run_dir)
        # the system metrics' constants: the device's peak (a CPU's is probed here, before the
        # training loads the cores) and the FLOPs of a step where the task's runtime counts them.
        # The peak is that of the precision the task computes in: task 4b's runtime chooses its
        # own mixed precision (bf16 autocast on a GPU whatever the run's --precision), the others
        # compute in the run's.
        self.computed_in = getattr(self.runtime, "precision", self.cfg.precision)
        self.device_peak = DevicePeak.of(self.device, self.computed_in, self.model)
        count_flops = getattr(self.runtime, "flops_per_step", None)
        self.step_flops: tuple[int, str] | None = count_flops() if count_flops is not None else None
        if self.cfg.resume_step is not None:
            self._load_checkpoint(self.cfg.resume_step)

    # -- checkpoints ----------------------------------------------------------------------------
    def _load_checkpoint(self, step: int) -> None:
        """Read this rank's state of the checkpoint of ``step``: the model and optimizer now, the
        runtime's and the random generators' when the loop has begun the checkpoint's epoch."""
        state = checkpoint.read(self.checkpoint_root, step, self.rank, seed=self.cfg.seed, workers=self.world,
                                shrunk=self.cfg.on_failure == "shrink")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.progress = Progress.from_checkpoint(state["progress"])
        self._resume = state
        self._checkpointed_at = self.progress.step
        self._checkpoint_clock = time.perf_counter()

    def _write_checkpoint(self, epoch: int, index: int) -> None:
        """This rank's state between two steps: about to run batch ``index`` of ``epoch``."""
        p = self.progress
        state = {"format": checkpoint.FORMAT, "step": p.step, "epoch": epoch, "batch": index,
                 "seed": self.cfg.seed, "workers": self.world, "task": self.spec.name,
                 "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "runtime": self.runtime.state_dict(), "rng": checkpoint.rng_state(self.device),
                 "progress": p.to_checkpoint()}
        seconds = checkpoint.write(self.checkpoint_root, self.rank, self.world, state)
        self._checkpointed_at = p.step
        self._checkpoint_clock = time.perf_counter()
        if self.rank == 0:
            self.events.emit("checkpoint", {"step": p.step, "seconds": seconds}, epoch=self._epoch_float(),
                             step=p.step)
        mtbf = self.cfg.checkpoint_auto_mtbf_s
        if mtbf is not None:
            self._checkpoint_costs.append(seconds)
            cost = statistics.median(self._checkpoint_costs)
            self._every_s = daly_interval(cost, mtbf)
            if self.rank == 0:
                self.events.emit("checkpoint/interval", {"seconds": self._every_s, "cost_s": cost, "mtbf_s": mtbf,
                                                         "rule": "Daly 2006"}, epoch=self._epoch_float(), step=p.step)

    def _checkpoint_due_by_steps(self) -> bool:
        every = self.cfg.checkpoint_every_steps
        step = self.progress.step
        return every is not None and step > 0 and step % every == 0 and step != self._checkpointed_at

    def _clock_checks(self) -> bool:
        """Whether the loop looks at clocks the workers must agree on."""
        return self.cfg.time_budget_s is not None or self.cfg.checkpoints

    # -- the loop -----------------------------------------------------------------------------
    def train(self) -> TrainingResult:
        """Train until the goal, the epoch cap, the time budget or the step cap; return the result.

        With checkpoints, one is written every ``--checkpoint-every`` and at a stop by the step
        cap, the time budget or a stop request (before the evaluation a stop adds); a resumed run
        (``resume_step``) starts at its checkpoint's epoch and batch with its state."""
        p = self.progress
        stop_reason = "max-epochs"
        evaluated_at = -1
        start_epoch, start_batch = 0, 0
        if self._resume is not None:
            start_epoch = int(self._resume["epoch"])
            start_batch = resumed_batch(int(self._resume["batch"]), int(self._resume["workers"]), self.world)
            evaluated_at = p.step if start_batch == 0 else -1  # the epoch's end was evaluated
            p.epoch, self._epoch_began = start_epoch, p.step - start_batch
        else:
            p.train_start = time.perf_counter()
        self._checkpoint_clock = time.perf_counter()
        self.sys_sampler = IntervalSampler(self.device)  # the sys/ events of each interval
        loss_sum = torch.zeros((), device=self.device)
        losses = torch.zeros(self.cfg.log_every, device=self.device)  # this interval's, per step
        interval_steps = interval_samples = 0
        interval_start_bytes = self.optimizer.bytes_sent
        for epoch in range(start_epoch, self.spec.settings.max_epochs):
            p.epoch = epoch
            self.runtime.begin_epoch(epoch)
            batches = self.runtime.batches(epoch)
            index = 0
            if self._resume is not None:  # the checkpoint's place in its epoch, and its state
                batches = itertools.islice(batches, start_batch, None)
                index = start_batch
                self.runtime.load_state_dict(self._resume["runtime"])
                checkpoint.set_rng_state(self._resume["rng"], self.device)
                self._resume = None
            self._epoch_began = p.step - index
            stop = None
            for batch in batches:
                if self.cfg.max_steps is not None and p.step >= self.cfg.max_steps:
                    stop = "max-steps"
                    break
                if self._clock_checks() and p.step >= self._next_budget_check:
                    spent, due, asked = self._agree()
                    if spent:
                        stop = "time-budget"
                        break
                    if asked:
                        stop = "stopped"
                        break
                    if due and p.step != self._checkpointed_at:
                        self._write_checkpoint(epoch, index)
                if self._checkpoint_due_by_steps():
                    self._write_checkpoint(epoch, index)
                index += 1
                lr = self.runtime.lr(p.step, batch)
                step_began = time.perf_counter()
                before = collectives_issued()
                loss = self.runtime.train_step(batch, lr, self.optimizer)
                self._count_collectives(before)
                if self.straggler is not None:
                    self.straggler.after_step(time.perf_counter() - step_began)
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
            if stop in CHECKPOINTED_STOPS and self.cfg.checkpoints and p.step != self._checkpointed_at:
                self._write_checkpoint(epoch, index)
            if stop == "stopped":
                raise Stopped(f"stopped at step {p.step} on request, with a checkpoint")
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
        result = self._result(stop_reason)   # before the CPU's last probe, which is no training
        self._record_system(final=True)
        return result

    def _record_system(self, final: bool = False) -> None:
        """This rank's ``system`` event as of now: written with every logging interval, so that
        the peak memory and FLOP/s of a run so far are readable while it trains and after it
        was cancelled or failed, and once more at the end (after the last evaluation), when a
        CPU's peak is probed again (:meth:`DevicePeak.merged`), off the training clock."""
        p = self.progress
        train_time = p.train_time()
        if final:
            self.device_peak = self.device_peak.merged(DevicePeak.of(self.device, self.computed_in, self.model))
        self.events.emit("system", system_record(self.device, self.device_peak, self.step_flops, steps=p.step,
                                                 train_time=train_time),
                         epoch=self._epoch_float(), step=p.step)

    def _agree(self) -> tuple[bool, bool, bool]:
        """All workers agree on whether the training-time budget is spent, whether a time-based
        checkpoint is due, whether a stop was asked for, and on the next check.

        One small all-reduce (MAX) carries the three flags and minus each worker's proposal of
        how many steps to wait until the next check (:func:`steps_between_checks`), so
        the slowest worker's pace sets the interval and the overshoot stays a fraction of a
        second without a collective on every step; a stop asked of any worker stops them all at
        the same step.
        """
        p = self.progress
        elapsed = p.train_time()
        per_step = elapsed / p.step if p.step else 0.0
        proposal = steps_between_checks(per_step)
        budget = self.cfg.time_budget_s
        every = self._every_s
        spent = budget is not None and elapsed >= budget
        due = every is not None and time.perf_counter() - self._checkpoint_clock >= every
        flags = torch.tensor([float(spent), float(due), float(self.stop_requested()), -float(proposal)],
                             device=self.device)
        if self.world > 1:
            # timed as communication, as the optimizer's collectives are: a link that drops its
            # packets holds this one as long (seen on the loaded box: 3.2 s of a 2-s outage, which
            # counted as no phase at all, and the run's link-down cost read as 0.03 s)
            self.timer.begin()
            before = collectives_issued()
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            self._count_collectives(before)
            self.timer.mark("communication")
        spent_f, due_f, asked_f, interval = flags.tolist()
        self._next_budget_check = p.step + int(-interval)
        return spent_f > 0, due_f > 0, asked_f > 0

    def _count_collectives(self, before: int | None) -> None:
        """Adds the collectives issued since ``before`` (:func:`collectives_issued`) to this
        interval's count: the training steps' and the stop checks' only, not an evaluation's or
        a checkpoint's, so that ``comm/collectives`` per step is what a step sends."""
        after = collectives_issued()
        if before is None or after is None:
            return
        self._collectives = (self._collectives or 0) + after - before

    def _epoch_float(self) -> float:
        """The epochs trained: the current epoch plus the share of it done. Without a shrink
        this is step / steps per epoch; after one, the epochs before it count whole at the old
        size (a run of 2 workers for 50 epochs, then 1 worker for 50 reports 100, not 75)."""
        p = self.progress
        return p.epoch + (p.step - self._epoch_began) / self.steps_per_epoch

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
        if self._collectives is not None:
            emit("comm/collectives", self._collectives, epoch=epoch, step=step)
            self._collectives = 0
        if self.straggler is not None:
            emit("fault/slowed", self.straggler.take_slowed(), epoch=epoch, step=step)
        for name, value in self.sys_sampler.sample().items():
            emit(name, value, epoch=epoch, step=step)
        self._record_system()

    def _check_finite(self, loss_sum: torch.Tensor, losses: torch.Tensor) -> float:
        """The interval's loss sum, read in the same device sync as whether each of its step
        losses and the parameters after its last step are finite; raises DivergedError naming
        the first step (counted from 1, as the events count) whose loss is not."""
        p = self.progress
        bad = ~torch.isfinite(losses)
        first_bad = torch.where(bad.any(), bad.float().argmax(), -1.0)
        params_ok = torch.stack([torch.isfinite(local_part(q)).all() for q in self.model.parameters()]).all()
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


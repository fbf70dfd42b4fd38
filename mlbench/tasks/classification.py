"""The settings of the classification tasks (1a: ResNet on CIFAR-10; 2a: logistic regression on
epsilon): one dataclass for both, since they train the same way; each task's package holds its values.

Torch-free (the CLI checks and records runs from it); the worker side is
:mod:`mlbench.tasks.classification_runtime`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from mlbench.tasks.spec import TrainingSettings


@dataclass(frozen=True)
class LRSchedule:
    """The learning-rate rule of a classification task (computed by :func:`learning_rate`).

    kind "warmup-multistep" (task 1a, Goyal et al. 2017, docs/tasks.md): the rate per sample
    ``eta`` scales with the global batch; it rises linearly from ``eta*b`` to ``eta*b*k`` over
    ``warmup_epochs`` and is divided by ``decay_factor`` at each of ``milestones`` (epochs).

    kind "inverse-sqrt" (task 2a): ``alpha(k) / sqrt(t)`` with t the step counted from 1 and
    ``alpha`` looked up by worker count in ``alpha_by_workers`` (the largest key <= k).
    """

    kind: str
    eta_per_sample: float = 0.0
    warmup_epochs: float = 0.0
    milestones: tuple[int, ...] = ()
    decay_factor: float = 10.0
    alpha_by_workers: tuple[tuple[int, float], ...] = ()

    def alpha(self, workers: int) -> float:
        """The inverse-sqrt rule's alpha for this worker count (the table's largest key <= k)."""
        chosen = self.alpha_by_workers[0][1]
        for k, value in self.alpha_by_workers:
            if workers >= k:
                chosen = value
        return chosen


def learning_rate(schedule: LRSchedule, *, workers: int, batch_per_worker: int, step: int,
                  steps_per_epoch: int) -> float:
    """The rate used for the update of ``step`` (0-based, counting every step of the run).

    A pure function of (rule, workers, step), so that every worker computes the same rate without
    communicating, a test can check the documented values at the documented epochs, and a single
    process can replay the schedule of k workers when checking exactness.

    warmup-multistep (task 1a): ``eta*b`` at step 0, rising linearly per step to ``eta*b*k`` at
    the end of ``warmup_epochs`` (Goyal et al. 2017, "gradual warm-up"), then constant and
    divided by ``decay_factor`` once at the start of each milestone epoch.

    inverse-sqrt (task 2a): ``alpha(k) / sqrt(t)`` with ``t = step + 1``.
    """
    if schedule.kind == "warmup-multistep":
        base = schedule.eta_per_sample * batch_per_worker
        peak = base * workers
        epoch_progress = step / steps_per_epoch
        if schedule.warmup_epochs > 0 and epoch_progress < schedule.warmup_epochs:
            rate = base + (peak - base) * epoch_progress / schedule.warmup_epochs
        else:
            rate = peak
        epoch = step // steps_per_epoch
        decays = sum(1 for m in schedule.milestones if epoch >= m)
        return rate / schedule.decay_factor ** decays
    if schedule.kind == "inverse-sqrt":
        return schedule.alpha(workers) / math.sqrt(step + 1)
    raise ValueError(f"unknown learning-rate schedule {schedule.kind!r}")


#: ``--set lr.NAME`` keys of the rate rule; ``lr.alpha`` replaces the whole alpha table by one value.
LR_KEYS: dict[str, type] = {"lr.eta_per_sample": float, "lr.warmup_epochs": float, "lr.milestones": tuple,
                            "lr.decay_factor": float, "lr.alpha": float}


@dataclass(frozen=True, kw_only=True)
class ClassificationSettings(TrainingSettings):
    """Model and data by name (:mod:`mlbench.tasks.models`, :mod:`mlbench.tasks.datasets`), the
    loss (:mod:`mlbench.tasks.losses`), the rate rule and an L2 term added to the loss."""

    model: str
    loss: str
    lr: LRSchedule
    l2: float = 0.0

    TEXT_KEYS: ClassVar[tuple[str, ...]] = ("model",)

    @classmethod
    def override_keys(cls) -> dict[str, type]:
        return {**super().override_keys(), **LR_KEYS}

    def value_of(self, key: str) -> Any:
        if key == "lr.alpha":
            return self.lr.alpha_by_workers
        if key.startswith("lr."):
            return getattr(self.lr, key[3:])
        return super().value_of(key)

    def stored_value(self, key: str, value: Any) -> Any:
        """``lr.alpha`` becomes a one-row alpha table (any worker count); 'resnet20' is short
        for 'resnet20-v1'."""
        if key == "lr.alpha":
            if self.lr.kind != "inverse-sqrt":
                raise ValueError("--set lr.alpha applies to inverse-sqrt schedules")
            return ((1, float(value)),)
        if key == "model":
            return value + "-v1" if re.fullmatch(r"resnet\d+", value) else value
        return value

    def with_values(self, values: dict[str, Any]) -> ClassificationSettings:
        top = {k: v for k, v in values.items() if not k.startswith("lr.")}
        rule = {k[3:]: v for k, v in values.items() if k.startswith("lr.")}
        if "alpha" in rule:
            rule["alpha_by_workers"] = rule.pop("alpha")
        lr = dataclasses.replace(self.lr, **rule) if rule else self.lr
        return dataclasses.replace(self, lr=lr, **top)

    def describe_rate(self) -> str:
        lr = self.lr
        if lr.kind == "warmup-multistep":
            return (f"eta = {lr.eta_per_sample:.6g} per sample; warm-up from eta*b to eta*b*k over "
                    f"{lr.warmup_epochs:g} epochs; / {lr.decay_factor:g} at epochs "
                    f"{', '.join(str(m) for m in lr.milestones)}")
        table = ", ".join(f"{a:g} (k>={k})" for k, a in lr.alpha_by_workers)
        return f"alpha / sqrt(t), alpha = {table}"

    def peak_lr(self, workers: int) -> float:
        """``eta*b*k`` (the rate after warm-up) or ``alpha(k)`` (inverse-sqrt's first step)."""
        if self.lr.kind == "warmup-multistep":
            return self.lr.eta_per_sample * self.batch_per_worker * workers
        return self.lr.alpha(workers)

    def describe_rows(self) -> list[list[Any]]:
        return [["model", self.model], ["L2 regularisation", f"{self.l2:g}"]]

    def mllog_hyperparameters(self, workers: int) -> dict[str, Any]:
        out = {**super().mllog_hyperparameters(workers), "opt_l2_regularisation": self.l2}
        lr = self.lr
        if lr.kind == "warmup-multistep":
            out["opt_base_learning_rate"] = lr.eta_per_sample * self.batch_per_worker * workers
            out["opt_learning_rate_warmup_epochs"] = lr.warmup_epochs
            out["opt_learning_rate_decay_boundary_epochs"] = list(lr.milestones)
            out["opt_learning_rate_decay_factor"] = 1.0 / lr.decay_factor
        else:
            out["opt_base_learning_rate"] = lr.alpha(workers)
            out["opt_learning_rate_schedule"] = "alpha / sqrt(t)"
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClassificationSettings:
        rule = dict(data["lr"])
        rule["milestones"] = tuple(rule.get("milestones", ()))
        rule["alpha_by_workers"] = tuple(tuple(p) for p in rule.get("alpha_by_workers", ()))
        names = {f.name for f in dataclasses.fields(LRSchedule)}
        lr = LRSchedule(**{k: v for k, v in rule.items() if k in names})
        return super().from_dict({**data, "lr": lr})


"""What every benchmark task is, whatever it trains: the spec and the settings contract.

A task is one package under ``mlbench/tasks/`` (``task1a/``, ``task3a/``, ...; AlgoPerf's workloads
and torchtitan's TrainSpec are the model), found by :mod:`mlbench.tasks.registry`. Its
``__init__`` declares a :class:`TaskSpec`: the fields here are what every training task has (a
title, a goal metric and its goals, the reference optimizer); everything else is the task's own
typed settings dataclass, a :class:`TrainingSettings`, which is the only home of each of its
numbers. This module imports no torch: the CLI validates and records a run from it alone.
"""

from __future__ import annotations

import dataclasses
import typing
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from mlbench.tasks.metrics import get_metric

SettingsT = TypeVar("SettingsT", bound="TrainingSettings")


@dataclass(frozen=True, kw_only=True)
class TrainingSettings(ABC):
    """The numbers of one training task; subclasses add the task's own.

    Every training task has a data set (by name, :mod:`mlbench.tasks.datasets`), a batch per
    worker, an epoch cap and the hyper-parameters of the SGD family (momentum, Nesterov, weight
    decay), because the data preparation, the trainer and every optimizer of :mod:`mlbench.optim`
    read them; a task whose method has no momentum keeps the defaults.

    ``--set NAME=VALUE`` may change any field whose type is a number or a flag (and the fields
    named in :attr:`TEXT_KEYS`); :meth:`override_keys` derives them from the fields, so a new
    setting is settable the moment it is declared.
    """

    dataset: str
    batch_per_worker: int
    max_epochs: int
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0

    #: Text fields that ``--set`` may change (numbers and flags always may).
    TEXT_KEYS: ClassVar[tuple[str, ...]] = ()
    #: Number fields that ``--set`` may not change (what the data preparation depends on).
    NOT_SETTABLE: ClassVar[tuple[str, ...]] = ()
    #: Fields that :meth:`describe_rate` shows (not repeated as rows of their own).
    RATE_FIELDS: ClassVar[tuple[str, ...]] = ()
    #: Whether the task clips or inspects the averaged gradient between the all-reduce and the
    #: update (then only optimizers that hold that gradient can train it).
    needs_averaged_gradient: ClassVar[bool] = False

    @classmethod
    def override_keys(cls) -> dict[str, type]:
        """``--set`` keys of this task's settings and the type each value is parsed as."""
        hints = typing.get_type_hints(cls)
        keys: dict[str, type] = {}
        for f in dataclasses.fields(cls):
            kind = hints[f.name]
            if f.name in cls.NOT_SETTABLE:
                continue
            if kind in (int, float, bool) or (kind is str and f.name in cls.TEXT_KEYS):
                keys[f.name] = kind
        return keys

    def value_of(self, key: str) -> Any:
        """The current value of an override key."""
        return getattr(self, key)

    def stored_value(self, key: str, value: Any) -> Any:
        """The value as the settings hold it (a ValueError, in words, where the key does not
        apply to these settings)."""
        return value

    def with_values(self: SettingsT, values: dict[str, Any]) -> SettingsT:
        """These settings with the (already typed and checked) override values applied."""
        return dataclasses.replace(self, **values)

    @abstractmethod
    def describe_rate(self) -> str:
        """The learning-rate rule in words, as ``mlbench tasks`` shows it."""

    @abstractmethod
    def peak_lr(self, workers: int) -> float:
        """The peak of the rate rule on ``workers`` workers (after warm-up, or at the first step of
        a rule that only decays): what an optimizer's absolute rate (``--opt lr=``) replaces,
        keeping the rule's shape."""

    def describe_rows(self) -> list[list[Any]]:
        """The task's own numbers as (name, value) rows after the rule (``mlbench tasks``), named
        as ``--set`` spells them."""
        common = {f.name for f in dataclasses.fields(TrainingSettings)}
        return [[f.name, getattr(self, f.name)] for f in dataclasses.fields(self)
                if f.name not in common and f.name not in self.RATE_FIELDS and f.name in self.override_keys()]

    def global_batch_size(self, workers: int) -> int:
        """Samples per step over ``workers`` workers, in the unit MLPerf's log counts (images,
        sequences): one batch per worker, unless a task fixes its global batch."""
        return workers * self.batch_per_worker

    def accumulation(self, workers: int) -> int:
        """Micro-batches a worker accumulates per step on ``workers`` workers."""
        return 1

    def check(self, workers: int) -> str | None:
        """Why these settings cannot run on ``workers`` workers, in words (None: they can). The
        CLI refuses such a run in one line before anything starts; the worker checks again."""
        return None

    def check_data(self, prepared: object, workers: int) -> str | None:
        """Why the data set as its preparation returned it (``Dataset.prepare``, :mod:`mlbench.tasks.datasets`)
        makes no training step of these settings on ``workers`` workers, in words (None: it
        makes one). The CLI refuses such a run in one line before it is recorded; the worker
        checks its own data again (synthetic data are drawn there)."""
        return None

    def optimizer_values(self) -> dict[str, float]:
        """The task's values of its reference optimizer's options (Adam's betas for 4b): they
        replace the optimizer's defaults, not what the user set."""
        return {}

    def mllog_hyperparameters(self, workers: int) -> dict[str, Any]:
        """The optimiser settings as MLPerf's log names them; the base rate is the rate after warm-up."""
        return {"opt_weight_decay": self.weight_decay, "opt_momentum": self.momentum,
                "opt_nesterov": self.nesterov}

    @classmethod
    def from_dict(cls: type[SettingsT], data: dict[str, Any]) -> SettingsT:
        """Settings from their ``dataclasses.asdict`` in run.json (JSON turns tuples into lists;
        they are tuples again)."""
        names = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in names}
        return cls(**values)


@dataclass(frozen=True)
class TaskSpec:
    """One training task of the closed division (docs/tasks.md): what every task has, and its settings.

    The task's own numbers are read through the spec as well (``spec.bptt`` is
    ``spec.settings.bptt``), so code that knows which task it holds need not unwrap it.
    """

    name: str
    title: str
    settings: TrainingSettings
    goal_full: float
    goal_light: float
    metric: str = "accuracy"
    optimizer: str = "centralized-sgd"  # the closed division's distributed optimizer
    notes: str = ""
    reference: str = ""
    #: What one training sample is, as the runtime's ``samples_in`` counts it and every surface
    #: names the throughput by: "images", "examples", "tokens", "target tokens" (per second).
    sample_unit: str = "samples"
    kind: ClassVar[str] = "training"

    def goal(self, light: bool) -> float:
        return self.goal_light if light else self.goal_full

    def __getattr__(self, name: str) -> Any:
        """A setting of the task (called only for names that are not fields of the spec)."""
        if name.startswith("__") or name == "settings":
            raise AttributeError(name)
        try:
            return getattr(self.settings, name)
        except AttributeError:
            raise AttributeError(f"{self.name} has no setting {name!r}") from None

    def with_settings(self, **values: Any) -> TaskSpec:
        """The spec with some settings replaced (no checks: :func:`mlbench.tasks.overrides.resolve`
        is the checked way)."""
        return dataclasses.replace(self, settings=dataclasses.replace(self.settings, **values))


@dataclass(frozen=True)
class AllreduceSpec:
    """Task 0a: the all-reduce micro-benchmark (no model, no data, no goal; docs/tasks.md).

    Messages of 1..``max_size`` elements (log-spaced) in each of ``dtypes``; per size up to
    ``warmup`` warm-up and ``iterations`` timed operations within about ``seconds_per_size``.
    """

    name: str
    title: str
    max_size: int
    dtypes: tuple[str, ...]
    warmup: int
    iterations: int
    seconds_per_size: float
    metric: str = "bus bandwidth"
    notes: str = ""
    reference: str = ""
    kind: str = "allreduce"

    def goal(self, light: bool) -> None:
        """A measurement has no goal."""
        return None


#: Any task's spec: a training task or the all-reduce benchmark.
AnySpec = TaskSpec | AllreduceSpec


def describe_task(spec: TaskSpec) -> list[list[Any]]:
    """The closed-division values of a training task as (name, value) rows (``mlbench tasks``)."""
    metric = get_metric(spec.metric)
    s = spec.settings
    rows: list[list[Any]] = [["data", s.dataset], ["batch per worker", s.batch_per_worker],
                             ["learning rate", s.describe_rate()], ["optimizer", spec.optimizer],
                             ["momentum", f"{s.momentum:g}" + (" (Nesterov)" if s.nesterov else "")],
                             ["weight decay", f"{s.weight_decay:g}"]]
    rows += s.describe_rows()
    rows += [["max epochs", s.max_epochs],
             ["goal", f"{metric.describe_goal(spec.goal_full)} (light: {metric.format(spec.goal_light)})"],
             ["throughput in", f"{spec.sample_unit}/s"]]
    return rows

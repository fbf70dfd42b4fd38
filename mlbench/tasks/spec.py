"""The benchmark tasks as declarative specs: every closed-division number lives here.

A :class:`TaskSpec` is data, not code (torchtitan's TrainSpec idea): the model name, the data set,
the batch per worker, the learning-rate rule, momentum, weight decay, L2, epochs and goals. The
worker builds everything from it. Users may override fields (`--set key=value`, `--model`, ...);
:func:`resolve` applies the overrides and reports which closed-division values changed, which is
what makes a run "open division" (docs/tasks.md, "Beyond the closed division").
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from mlbench.errors import UsageError


@dataclass(frozen=True)
class LRSchedule:
    """The learning-rate rule of a task.

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


@dataclass(frozen=True)
class TaskSpec:
    """One benchmark task of the closed division (docs/tasks.md), plus the knobs users may change."""

    name: str
    title: str
    model: str
    dataset: str
    batch_per_worker: int
    lr: LRSchedule
    momentum: float
    nesterov: bool
    weight_decay: float
    l2: float
    max_epochs: int
    goal_full: float
    goal_light: float
    loss: str
    metric: str = "accuracy"
    notes: str = ""
    reference: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    kind: str = "training"   # or "allreduce": task 0a, a communication benchmark (no model, no data)
    runtime: str = "classification"   # the builder of its worker-side runtime (worker/runtimes.py)

    def goal(self, light: bool) -> float:
        return self.goal_light if light else self.goal_full


TASK1A = TaskSpec(
    name="task1a",
    title="Image classification: ResNet-20 on CIFAR-10",
    model="resnet20-v1",
    dataset="cifar10",
    batch_per_worker=32,
    lr=LRSchedule(kind="warmup-multistep", eta_per_sample=0.1 / 256, warmup_epochs=5,
                  milestones=(82, 109), decay_factor=10.0),
    momentum=0.9,
    nesterov=True,
    weight_decay=1e-4,
    l2=0.0,
    max_epochs=164,
    goal_full=0.80,
    goal_light=0.70,
    loss="cross-entropy",
    reference="He et al. 2015 (ResNet); Goyal et al. 2017 (warm-up); MLBench task 1a",
)

TASK2A = TaskSpec(
    name="task2a",
    title="Linear learning: L2 logistic regression on epsilon",
    model="logreg",
    dataset="epsilon",
    batch_per_worker=100,
    lr=LRSchedule(kind="inverse-sqrt",
                  alpha_by_workers=((1, 200.0), (2, 400.0), (4, 600.0), (8, 700.0), (16, 800.0))),
    momentum=0.0,
    nesterov=False,
    weight_decay=0.0,
    l2=0.0000025,
    max_epochs=10,
    goal_full=0.89,
    goal_light=0.80,
    loss="logistic",
    notes="max_epochs is not fixed by the specification; 10 epochs is mlbench's cap",
    reference="PASCAL 2008 large-scale challenge (epsilon); MLBench task 2a",
)

@dataclass(frozen=True)
class AllreduceSpec:
    """Task 0a: the all-reduce micro-benchmark (no model, no data, no goal; docs/tasks.md).

    Messages of 1..``max_size`` elements (log-spaced) in each of ``dtypes``; per size up to
    ``warmup`` warm-up and ``iterations`` timed operations within about ``seconds_per_size``.
    """

    name: str
    title: str
    max_size: int = 10**8
    dtypes: tuple[str, ...] = ("fp32", "fp16", "bf16")
    warmup: int = 5
    iterations: int = 20
    seconds_per_size: float = 0.5
    metric: str = "bus bandwidth"
    notes: str = ""
    reference: str = ""
    kind: str = "allreduce"

    def goal(self, light: bool) -> None:
        """A measurement has no goal."""
        return None


#: Any task's spec: a training task or the all-reduce benchmark.
AnySpec = TaskSpec | AllreduceSpec

TASK0A = AllreduceSpec(
    name="task0a",
    title="Communication: all-reduce latency and bandwidth of the backend",
    notes="messages of 1..max_size elements (log-spaced); nccl-tests' time, algbw and busbw per size",
    reference="MLBench task 0a; bandwidths as NVIDIA nccl-tests (doc/PERFORMANCE.md)",
)

TASKS: dict[str, AnySpec] = {t.name: t for t in (TASK0A, TASK1A, TASK2A)}

#: Fields a user may override with ``--set key=value``, with their type.
OVERRIDABLE: dict[str, type] = {
    "model": str,
    "batch_per_worker": int,
    "momentum": float,
    "nesterov": bool,
    "weight_decay": float,
    "l2": float,
    "max_epochs": int,
    "goal_full": float,
    "goal_light": float,
    "lr.eta_per_sample": float,
    "lr.warmup_epochs": float,
    "lr.milestones": tuple,
    "lr.decay_factor": float,
    "lr.alpha": float,
}


def get_task(name: str) -> AnySpec:
    try:
        return TASKS[name]
    except KeyError:
        raise UsageError(f"unknown task {name!r}; choose one of: {', '.join(TASKS)} "
                         "(see `mlbench tasks`)") from None


def _parse_value(key: str, raw: str) -> Any:
    kind = OVERRIDABLE[key]
    try:
        if kind is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if kind is tuple:
            return tuple(int(v) for v in raw.split(",") if v.strip())
        value = kind(raw)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(raw)
        return value
    except ValueError:
        raise UsageError(f"--set {key}={raw}: expected a {kind.__name__}") from None


def parse_overrides(pairs: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["momentum=0", "lr.milestones=50,75"]`` -> typed values, or a UsageError."""
    result: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or key not in OVERRIDABLE:
            raise UsageError(f"--set {pair!r}: expected KEY=VALUE with KEY one of "
                             f"{', '.join(OVERRIDABLE)}")
        result[key] = _parse_value(key, raw.strip())
    return result


def resolve(task: AnySpec, overrides: dict[str, Any]) -> tuple[AnySpec, list[str]]:
    """Apply overrides; return the new spec and the closed-division fields that changed.

    ``lr.alpha`` replaces the whole inverse-sqrt alpha table by one value (any worker count).
    """
    if isinstance(task, AllreduceSpec):
        if overrides:
            raise UsageError(f"{task.name} measures the all-reduce itself and takes no --set or "
                             "--model; use --max-size to cap the messages")
        return task, []
    changed: list[str] = []
    top: dict[str, Any] = {}
    lr_fields: dict[str, Any] = {}
    for key, value in overrides.items():
        if key.startswith("lr."):
            sub = key[3:]
            if sub == "alpha":
                if task.lr.kind != "inverse-sqrt":
                    raise UsageError(f"--set lr.alpha applies to inverse-sqrt schedules, "
                                     f"not to {task.name}")
                new = ((1, float(value)),)
                if new != task.lr.alpha_by_workers:
                    changed.append(key)
                lr_fields["alpha_by_workers"] = new
                continue
            if getattr(task.lr, sub) != value:
                changed.append(key)
            lr_fields[sub] = value
        else:
            current = getattr(task, key)
            if key == "model" and _same_model(current, value):
                value = current
            if current != value:
                changed.append(key)
            top[key] = value
    lr = dataclasses.replace(task.lr, **lr_fields) if lr_fields else task.lr
    return dataclasses.replace(task, lr=lr, **top), changed


def _same_model(a: str, b: str) -> bool:
    """'resnet20' is short for 'resnet20-v1'."""
    norm = lambda m: m if "-v" in m or not m.startswith("resnet") else m + "-v1"  # noqa: E731
    return norm(a) == norm(b)


def spec_to_dict(task: AnySpec) -> dict[str, Any]:
    return dataclasses.asdict(task)


def spec_from_dict(data: dict[str, Any]) -> AnySpec:
    data = dict(data)
    if data.get("kind") == "allreduce":
        # records before AllreduceSpec kept the sweep's parameters under "extra"
        flat = {**data, **data.pop("extra", {})}
        known = {f.name for f in dataclasses.fields(AllreduceSpec)}
        spec = AllreduceSpec(**{k: v for k, v in flat.items() if k in known})
        return dataclasses.replace(spec, dtypes=tuple(spec.dtypes))
    lr = dict(data.pop("lr"))
    lr["milestones"] = tuple(lr.get("milestones", ()))
    lr["alpha_by_workers"] = tuple(tuple(p) for p in lr.get("alpha_by_workers", ()))
    return TaskSpec(lr=LRSchedule(**lr), **data)

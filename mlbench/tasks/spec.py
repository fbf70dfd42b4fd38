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
from mlbench.tasks.metrics import get_metric


@dataclass(frozen=True)
class LRSchedule:
    """The learning-rate rule of a task.

    kind "warmup-multistep" (task 1a, Goyal et al. 2017, docs/tasks.md): the rate per sample
    ``eta`` scales with the global batch; it rises linearly from ``eta*b`` to ``eta*b*k`` over
    ``warmup_epochs`` and is divided by ``decay_factor`` at each of ``milestones`` (epochs).

    kind "inverse-sqrt" (task 2a): ``alpha(k) / sqrt(t)`` with t the step counted from 1 and
    ``alpha`` looked up by worker count in ``alpha_by_workers`` (the largest key <= k).

    kind "sqrt-workers-seq-len" (task 3a): ``base * sqrt(k)``, rescaled per batch by its sequence
    length over the BPTT length (then ``base`` again once averaged SGD starts).

    kind "warmup-inverse-sqrt" (task 4b): from 0 linearly to ``base`` over ``warmup_steps``,
    then ``base * sqrt(warmup_steps / step)``.

    The last two are computed by their tasks' runtimes, which know the batch and the switch.
    """

    kind: str
    eta_per_sample: float = 0.0
    warmup_epochs: float = 0.0
    milestones: tuple[int, ...] = ()
    decay_factor: float = 10.0
    alpha_by_workers: tuple[tuple[int, float], ...] = ()
    base: float = 0.0
    warmup_steps: int = 0

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
    optimizer: str = "centralized-sgd"  # the closed division's distributed optimizer

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

TASK3A = TaskSpec(
    name="task3a",
    title="Language modelling: AWD-LSTM on Wikitext-2",
    model="awd-lstm",
    dataset="wikitext2",
    batch_per_worker=20,
    lr=LRSchedule(kind="sqrt-workers-seq-len", base=15.0),
    momentum=0.0,
    nesterov=False,
    weight_decay=1.2e-6,
    l2=0.0,
    max_epochs=750,
    goal_full=70.0,
    goal_light=90.0,
    loss="cross-entropy",
    metric="perplexity",
    runtime="language-model",
    extra={"eval_batch": 10, "bptt": 70, "asgd_lr": 15.0, "grad_clip": 0.25, "ar_alpha": 2.0,
           "tar_beta": 1.0, "nonmono": 5, "embedding": 400, "hidden": 1150, "layers": 3,
           "dropout": 0.4, "dropout_h": 0.2, "dropout_i": 0.65, "dropout_e": 0.1, "weight_drop": 0.5},
    notes="validation perplexity, lower is better; averaged SGD after the non-monotone trigger",
    reference="Merity et al. 2018 (AWD-LSTM, arXiv:1708.02182); MLBench task 3a",
)

TASK4B = TaskSpec(
    name="task4b",
    title="Machine translation: Transformer (big) on WMT17 en-de",
    model="transformer-big",
    dataset="wmt17-en-de",
    batch_per_worker=2**13,  # tokens
    lr=LRSchedule(kind="warmup-inverse-sqrt", base=1.976e-3, warmup_steps=1000),
    momentum=0.0,
    nesterov=False,
    weight_decay=0.0,
    l2=0.0,
    max_epochs=10,
    goal_full=25.0,
    goal_light=20.0,
    loss="label-smoothed-cross-entropy",
    metric="bleu",
    runtime="translation",
    optimizer="centralized-adam",
    extra={"adam": {"beta1": 0.9, "beta2": 0.98, "eps": 1e-9, "lr_scale": 1.0},
           "global_tokens": 2**17, "batch_multiple": 8, "max_len": 80, "label_smoothing": 0.1,
           "beam": 4, "length_penalty": 0.6, "dim": 1024, "ffn": 4096, "heads": 16,
           "encoder_layers": 6, "decoder_layers": 6, "dropout": 0.1, "attention_dropout": 0.1,
           "activation_dropout": 0.1},
    notes="batch_per_worker counts tokens; BLEU on newstest2014 (sacreBLEU), beam 4, length penalty 0.6",
    reference="Vaswani et al. 2017 (Transformer big, pre-norm); MLBench task 4b",
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

TASKS: dict[str, AnySpec] = {t.name: t for t in (TASK0A, TASK1A, TASK2A, TASK3A, TASK4B)}

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


def describe_rule(lr: LRSchedule) -> str:
    """A learning-rate rule in words, as `mlbench tasks` shows it."""
    if lr.kind == "warmup-multistep":
        return (f"eta = {lr.eta_per_sample:.6g} per sample; warm-up from eta*b to eta*b*k over "
                f"{lr.warmup_epochs:g} epochs; / {lr.decay_factor:g} at epochs "
                f"{', '.join(str(m) for m in lr.milestones)}")
    if lr.kind == "inverse-sqrt":
        table = ", ".join(f"{a:g} (k>={k})" for k, a in lr.alpha_by_workers)
        return f"alpha / sqrt(t), alpha = {table}"
    if lr.kind == "sqrt-workers-seq-len":
        return f"{lr.base:g} x sqrt(k), x seq_len / bptt per batch; {lr.base:g} x seq_len / bptt once averaging"
    if lr.kind == "warmup-inverse-sqrt":
        return (f"{lr.base:g}, warmed up linearly from 0 over {lr.warmup_steps} steps, then "
                f"x sqrt({lr.warmup_steps} / step)")
    return lr.kind


def describe_task(spec: TaskSpec) -> list[list[Any]]:
    """The closed-division values of a training task as (name, value) rows."""
    metric = get_metric(spec.metric)
    rows: list[list[Any]] = [
        ["model", spec.model], ["data", spec.dataset],
        ["batch per worker", spec.batch_per_worker], ["learning rate", describe_rule(spec.lr)],
        ["optimizer", spec.optimizer],
        ["momentum", f"{spec.momentum:g}" + (" (Nesterov)" if spec.nesterov else "")],
        ["weight decay", f"{spec.weight_decay:g}"], ["L2 regularisation", f"{spec.l2:g}"],
        ["max epochs", spec.max_epochs],
        ["goal", f"{metric.describe_goal(spec.goal_full)} (light: {metric.format(spec.goal_light)})"],
    ]
    for key, value in spec.extra.items():
        shown = ", ".join(f"{k} {v:g}" for k, v in value.items()) if isinstance(value, dict) else value
        rows.append([key.replace("_", " "), shown])
    return rows


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


#: The values each overridable number may take: (lowest, highest, whether the lowest itself is
#: allowed, whether the highest is). A value outside its range would crash the workers or train
#: nothing, so it is refused before a run exists.
RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "batch_per_worker": (1, 2**20, True, True),
    "momentum": (0.0, 1.0, True, False),          # below 1: momentum 1 never forgets a gradient
    "weight_decay": (0.0, 1.0, True, True),
    "l2": (0.0, 1.0, True, True),
    "max_epochs": (1, 1_000_000, True, True),
    "lr.eta_per_sample": (0.0, 1.0, False, True),
    "lr.warmup_epochs": (0.0, 10_000, True, True),
    "lr.decay_factor": (0.0, 1e6, False, True),
    "lr.alpha": (0.0, 1e3, False, True),
}


def _check_range(key: str, value: Any) -> None:
    if key == "lr.milestones":
        if any(m < 1 for m in value) or list(value) != sorted(set(value)):
            listed = ",".join(map(str, value))
            raise UsageError(f"--set lr.milestones={listed}: give increasing epochs, each at least 1")
        return
    if key not in RANGES:
        return
    low, high, low_allowed, high_allowed = RANGES[key]
    above_low = value >= low if low_allowed else value > low
    below_high = value <= high if high_allowed else value < high
    if not (above_low and below_high):
        lower = f"at least {_num(low)}" if low_allowed else f"above {_num(low)}"
        upper = f"at most {_num(high)}" if high_allowed else f"below {_num(high)}"
        raise UsageError(f"--set {key}={_num(value)}: must be {lower} and {upper}")


def _num(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() and abs(value) >= 1 else f"{value:g}"


def _check_extra_range(name: str, value: Any) -> None:
    """A task's own numbers are sizes, counts and rates: never negative; rates of dropout below 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if value < 0:
        raise UsageError(f"--set extra.{name}={value:g}: must be at least 0")
    if "dropout" in name or name in ("weight_drop", "label_smoothing"):
        if value >= 1:
            raise UsageError(f"--set extra.{name}={value:g}: a rate, at least 0 and below 1")
    elif isinstance(value, int) and value == 0 and name not in ("nonmono",):
        raise UsageError(f"--set extra.{name}=0: must be at least 1")


def parse_overrides(pairs: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["momentum=0", "lr.milestones=50,75"]`` -> typed values, or a UsageError."""
    result: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if sep and key.startswith("extra.") and len(key) > 6:
            result[key] = raw.strip()  # typed by resolve(), which knows the task's value
            continue
        if not sep or key not in OVERRIDABLE:
            raise UsageError(f"--set {pair!r}: expected KEY=VALUE with KEY one of "
                             f"{', '.join(OVERRIDABLE)}, or extra.NAME for a task's own setting")
        result[key] = _parse_value(key, raw.strip())
        _check_range(key, result[key])
    return result


def _extra_value(task: TaskSpec, name: str, raw: Any) -> Any:
    """``--set extra.NAME=VALUE``: VALUE typed like the task's own value of NAME."""
    if name not in task.extra or isinstance(task.extra[name], dict):
        settable = ", ".join(k for k, v in task.extra.items() if not isinstance(v, dict)) or "none"
        raise UsageError(f"--set extra.{name}: {task.name} has no setting {name!r}; its settings: {settable}")
    current = task.extra[name]
    if not isinstance(raw, str):
        return raw
    try:
        if isinstance(current, bool):
            if raw.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                return raw.lower() in ("1", "true", "yes", "on")
            raise ValueError(raw)
        value = type(current)(raw)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(raw)
        return value
    except ValueError:
        raise UsageError(f"--set extra.{name}={raw}: expected a {type(current).__name__}") from None


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
    extra = dict(task.extra)
    for key, value in overrides.items():
        if key.startswith("extra."):
            name = key[6:]
            typed = _extra_value(task, name, value)
            _check_extra_range(name, typed)
            if typed != task.extra[name]:
                changed.append(key)
            extra[name] = typed
            continue
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
    metric = get_metric(task.metric)
    for key in ("goal_full", "goal_light"):
        problem = metric.check_goal(top[key]) if key in top else None
        if problem:
            raise UsageError(f"--set {key}={top[key]:g}: {problem}")
    return dataclasses.replace(task, lr=lr, extra=extra, **top), changed


def _same_model(a: str, b: str) -> bool:
    """'resnet20' is short for 'resnet20-v1'."""
    norm = lambda m: m if "-v" in m or not m.startswith("resnet") else m + "-v1"
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

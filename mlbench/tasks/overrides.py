"""``--set KEY=VALUE``: the user's changes to a task's closed-division values, typed and checked.

The keys are the goals of the spec and the fields of the task's settings dataclass
(:meth:`~mlbench.tasks.spec.TrainingSettings.override_keys`); ``extra.NAME``, the spelling of
earlier versions for a task's own number, is still accepted. :func:`resolve` applies the values
and reports which closed-division values changed, which is what makes a run "open division"
(docs/tasks.md, "Beyond the closed division").
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any

from mlbench.errors import UsageError
from mlbench.tasks.metrics import get_metric
from mlbench.tasks.registry import TASKS
from mlbench.tasks.spec import AllreduceSpec, AnySpec, TaskSpec, TrainingSettings

#: Keys of the spec itself (the settings' keys come from each task).
SPEC_KEYS: dict[str, type] = {"goal_full": float, "goal_light": float}
#: Task 0a's keys: how long each message size is measured (its largest message is --max-size).
ALLREDUCE_KEYS: dict[str, type] = {"iterations": int, "warmup": int, "seconds_per_size": float}

#: The values some numbers may take: (lowest, highest, whether the lowest itself is allowed,
#: whether the highest is). A value outside its range would crash the workers or train nothing,
#: so it is refused before a run exists. Other numbers of a task follow :func:`_check_own_range`.
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
    "iterations": (1, 1_000_000, True, True),
    "warmup": (0, 1_000_000, True, True),
    "seconds_per_size": (0.0, 3600.0, False, True),
}

#: The keys of the settings every training task has (their ranges are :data:`RANGES`).
_COMMON_KEYS = tuple(TrainingSettings.override_keys())


def overridable() -> dict[str, type]:
    """Every ``--set`` key of any task, with its type (a task accepts its own subset)."""
    keys = dict(SPEC_KEYS)
    for spec in TASKS.values():
        if isinstance(spec, TaskSpec):
            keys.update({k: v for k, v in spec.settings.override_keys().items() if k not in keys})
        else:
            keys.update({k: v for k, v in ALLREDUCE_KEYS.items() if k not in keys})
    return keys


def task_keys(spec: TaskSpec) -> dict[str, type]:
    """The ``--set`` keys of one training task."""
    return {**SPEC_KEYS, **spec.settings.override_keys()}


def parse_overrides(pairs: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["momentum=0", "lr.milestones=50,75"]`` -> typed values, or a UsageError."""
    keys = overridable()
    result: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if sep and key.startswith("extra.") and len(key) > 6:
            result[key] = raw.strip()  # typed by resolve(), which knows the task's settings
            continue
        if not sep or not key:
            raise UsageError(f"--set {pair!r}: expected KEY=VALUE, e.g. --set momentum=0", option="overrides")
        if key not in keys:
            near = difflib.get_close_matches(key, list(keys), n=1)
            hint = f"; did you mean {near[0]}?" if near else ""
            raise UsageError(f"--set {pair!r}: no task has a setting {key!r}{hint} (`mlbench tasks` lists each "
                             "task's)", option="overrides")
        result[key] = _typed(key, raw.strip(), keys[key])
        _check_range(key, key, result[key])
    return result


def _typed(key: str, raw: str, kind: type) -> Any:
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
        raise UsageError(f"--set {key}={raw}: expected a {kind.__name__}", option="overrides") from None


def _check_range(key: str, name: str, value: Any) -> None:
    """``key`` as the user wrote it, ``name`` the setting it changes."""
    if name == "lr.milestones":
        if any(m < 1 for m in value) or list(value) != sorted(set(value)):
            listed = ",".join(map(str, value))
            raise UsageError(f"--set lr.milestones={listed}: give increasing epochs, each at least 1",
                             option="overrides")
        return
    if name not in RANGES:
        if name not in _COMMON_KEYS and name not in SPEC_KEYS:
            _check_own_range(key, name, value)
        return
    low, high, low_allowed, high_allowed = RANGES[name]
    above_low = value >= low if low_allowed else value > low
    below_high = value <= high if high_allowed else value < high
    if not (above_low and below_high):
        lower = f"at least {_num(low)}" if low_allowed else f"above {_num(low)}"
        upper = f"at most {_num(high)}" if high_allowed else f"below {_num(high)}"
        raise UsageError(f"--set {key}={_num(value)}: must be {lower} and {upper}", option="overrides")


def _num(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() and abs(value) >= 1 else f"{value:g}"


def _check_own_range(key: str, name: str, value: Any) -> None:
    """A task's own numbers are sizes, counts and rates: never negative; rates of dropout below 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if value < 0:
        raise UsageError(f"--set {key}={value:g}: must be at least 0", option="overrides")
    if "dropout" in name or name in ("weight_drop", "label_smoothing"):
        if value >= 1:
            raise UsageError(f"--set {key}={value:g}: a rate, at least 0 and below 1", option="overrides")
    elif isinstance(value, int) and value == 0 and name not in ("nonmono",):
        raise UsageError(f"--set {key}=0: must be at least 1", option="overrides")


def _own_setting(task: TaskSpec, key: str, value: Any) -> tuple[str, Any]:
    """The setting a key changes, and its value typed like the task's own."""
    name = key[6:] if key.startswith("extra.") else key
    keys = task_keys(task)
    if name not in keys:
        own = ", ".join(k for k in task.settings.override_keys() if k not in _COMMON_KEYS)
        raise UsageError(f"--set {key}: {task.name} has no setting {name!r}; its settings: "
                         f"{', '.join(_COMMON_KEYS)}, {own}", option="overrides")
    kind = keys[name]
    if isinstance(value, str) and kind is not str:
        return name, _typed(key, value, kind)
    if kind in (int, float) and not isinstance(value, bool) and type(value) is not kind:
        return name, _typed(key, str(value), kind)
    return name, value


def _resolve_sweep(task: AllreduceSpec, overrides: dict[str, Any]) -> tuple[AllreduceSpec, list[str]]:
    """Task 0a with its ``--set`` values (:data:`ALLREDUCE_KEYS`): each size's timed and warm-up
    operations and its time budget. Any other key is refused in one line that names the three."""
    values: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in ALLREDUCE_KEYS:
            raise UsageError(f"--set {key}: {task.name} measures the all-reduce itself; its keys are "
                             f"{', '.join(ALLREDUCE_KEYS)} (the largest message is --max-size)", option="overrides")
        kind = ALLREDUCE_KEYS[key]
        if isinstance(value, str):
            value = _typed(key, value, kind)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
            raise UsageError(f"--set {key}={value}: expected a {kind.__name__}", option="overrides")
        values[key] = kind(value)
        _check_range(key, key, values[key])
    changed = [key for key, value in values.items() if value != getattr(task, key)]
    return dataclasses.replace(task, **values), changed


def resolve(task: AnySpec, overrides: dict[str, Any]) -> tuple[AnySpec, list[str]]:
    """Apply overrides; return the new spec and the closed-division keys that changed."""
    if isinstance(task, AllreduceSpec):
        return _resolve_sweep(task, overrides)
    changed: list[str] = []
    goals: dict[str, Any] = {}
    values: dict[str, Any] = {}
    for key, raw in overrides.items():
        name, value = _own_setting(task, key, raw)
        _check_range(key, name, value)
        if name in SPEC_KEYS:
            if value != getattr(task, name):
                changed.append(key)
            goals[name] = value
            continue
        try:
            stored = task.settings.stored_value(name, value)
        except ValueError as refused:
            raise UsageError(f"{refused}, not to {task.name}") from None
        if stored != task.settings.value_of(name):
            changed.append(key)
        values[name] = stored
    metric = get_metric(task.metric)
    for key, goal in goals.items():
        problem = metric.check_goal(goal)
        if problem:
            raise UsageError(f"--set {key}={goal:g}: {problem}", option="overrides")
    return dataclasses.replace(task, settings=task.settings.with_values(values), **goals), changed

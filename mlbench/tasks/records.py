"""A task spec as it is stored in run.json, and back.

Since tasks have their own settings, a spec is stored as its common fields plus ``settings``.
Runs recorded by earlier versions stored one flat dict per spec (every number a field, the
language tasks' own numbers under ``extra``, the rate rule under ``lr``); they still load, into
today's settings, so that status, compare and download work on old runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlbench.tasks.registry import TASKS
from mlbench.tasks.spec import AllreduceSpec, AnySpec, TaskSpec

#: Fields of a training spec in the flat format of earlier versions that are not settings.
_FLAT_SPEC_FIELDS = ("name", "title", "goal_full", "goal_light", "metric", "optimizer", "notes", "reference",
                     "sample_unit")


def spec_to_dict(task: AnySpec) -> dict[str, Any]:
    data = dataclasses.asdict(task)
    if isinstance(task, TaskSpec):
        data["kind"] = task.kind
    return data


def spec_from_dict(data: dict[str, Any]) -> AnySpec:
    data = dict(data)
    if data.get("kind") == "allreduce":
        # records before AllreduceSpec kept the sweep's parameters under "extra"
        flat = {**data, **data.pop("extra", {})}
        known = {f.name for f in dataclasses.fields(AllreduceSpec)}
        spec = AllreduceSpec(**{k: v for k, v in flat.items() if k in known})
        return dataclasses.replace(spec, dtypes=tuple(spec.dtypes))
    task = TASKS.get(data["name"])
    if not isinstance(task, TaskSpec):
        raise KeyError(f"{data['name']} is not a training task of this version")
    settings_type = type(task.settings)
    if "settings" in data:
        settings = settings_type.from_dict(data["settings"])
    else:
        settings = settings_type.from_dict(_flat_settings(data))
    common = {k: v for k, v in data.items() if k in _FLAT_SPEC_FIELDS}
    common.setdefault("sample_unit", task.sample_unit)  # recorded before the spec named it
    return TaskSpec(settings=settings, **common)


def _flat_settings(data: dict[str, Any]) -> dict[str, Any]:
    """The settings of a spec stored flat: the rate rule's numbers and ``extra`` become fields
    (the classification tasks keep their rule as ``lr``; 4b's token batch was ``batch_per_worker``
    already and Adam's values ``extra.adam``)."""
    values = {k: v for k, v in data.items() if k not in _FLAT_SPEC_FIELDS and k != "extra"}
    rule = dict(values.get("lr") or {})
    if rule.get("kind") in ("sqrt-workers-seq-len", "warmup-inverse-sqrt"):
        values["lr"] = rule["base"]
        values["warmup_steps"] = rule.get("warmup_steps")
    for name, value in (data.get("extra") or {}).items():
        if name == "adam":
            values.update({f"adam_{k}": v for k, v in value.items()})
        else:
            values[name] = value
    return {k: v for k, v in values.items() if v is not None}

"""What a run is, for the tools researchers already look at curves in (TensorBoard, MLflow, W&B).

One translation of a run's record into points (a name, a number, a step, a time), a summary
and hyper-parameters, shared by every exporter (:mod:`mlbench.results.exporters`), by
`mlbench export` after a run and by `--log-to` during one, so the three tools and the two ways
show the same numbers under the same names (docs/exporters.md):

- every number an event recorded, as recorded: ``train/loss``, ``train/lr``, ``train/time``,
  ``train/samples``, ``time/<phase>``, ``comm/bytes``, ``eval/<metric>`` (the task's own
  metric by its own name: ``eval/accuracy`` a fraction, ``eval/perplexity``, ``eval/bleu``);
  rank 0's under the event's name (what `status` shows), each other worker's under
  ``rank<r>/<name>``, so that stragglers show in per-rank curves;
- task 0a's sweep as ``allreduce/<dtype>/<figure>`` with the message size in bytes as the step;
- the summary (``summary/...``) and the result (``result/...``) as `status RUN` reports them,
  with the unit in the name where there is one (``_s``, ``_gbps``, ``_us``);
- a run with faults or restarts: what they cost in the summary (``faults/goodput``,
  ``faults/restarts``, ``faults/redone_steps``, ``faults/checkpoint_s``, ``faults/stalled_s``,
  ``faults/link_down_s``, ``faults/recovery_s``, ``faults/applied``), and each moment of its
  timeline (:mod:`mlbench.results.timeline`) as a point at its step: ``timeline/faults``,
  ``timeline/missed``, ``timeline/restarts``, ``timeline/shrinks``, ``timeline/resumes``, each
  the count so far, so that a tool's curves show where each one fell.

A series' name comes from its event, which workers and plug-ins write, so it can be anything;
in MLflow's store it becomes a file's path. Every name is exported as a safe key
(:func:`safe_key`), the same in every tool, and two names of one run that would share a key are
refused in one line (:class:`SeriesNames`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from mlbench.errors import UsageError
from mlbench.results.events import NUMERIC_PREFIXES, read_run_events
from mlbench.results.outcome import AllreduceResult, TrainingResult, read_result
from mlbench.results.goodput import had_faults, run_faults
from mlbench.results.report import task_metric
from mlbench.results.store import RunRecord
from mlbench.results.summary import RunSummary, phase_table, summarize
from mlbench.results.timeline import run_timeline
from mlbench.jsonfile import read_json
from mlbench.run_config import RUN_JSON
from mlbench.tasks.metrics import LATENCY, Metric, get_metric
from mlbench.tasks.registry import TASKS

#: The figures of one all-reduce row that become points (the row's other keys describe it).
SWEEP_FIGURES = {"busbw_gbps": "busbw_gbps", "algbw_gbps": "algbw_gbps", "time_s": "time_us"}

#: Catalog fields that are hyper-parameters of a run (the rest of them come from run.json). Its
#: state is an outcome, not a setting, and changes while a live export writes (``--log-to``):
#: each tool has it as the run's status and in the note (:func:`~mlbench.results.exporters.metrics_text`).
_CATALOG_PARAMS = ("name", "task", "workers", "division", "optimizer", "launcher", "seed", "group_id")


@dataclass(frozen=True)
class Point:
    """One value of a named series: ``step`` is the training step (the message size in bytes
    for task 0a's sweep), ``time`` unix seconds."""

    tag: str
    value: float | int
    step: int
    time: float


@dataclass
class RunHead:
    """What an exporter writes before the first point: the run's identity, its configuration
    as flat hyper-parameters, and what the goal metric is."""

    id: str
    name: str
    task: str
    state: str
    started_at: float
    group_id: str | None
    metric: Metric
    #: the series the goal metric is in: ``eval/<metric>``, or task 0a's ``result/peak_...``
    goal_tag: str
    hparams: dict[str, str | int | float | bool] = field(default_factory=dict)

    @property
    def metric_info(self) -> dict[str, str | bool]:
        """The goal metric as tags: its event name, title, unit ('fraction': 0..1) and direction."""
        described = self.metric.describe()
        return {"goal_metric": self.goal_tag, "goal_metric_title": self.metric.title,
                "goal_metric_unit": str(described["unit"]), "higher_is_better": self.metric.higher_is_better}


@dataclass
class ExportedRun:
    """A whole ended run: its head, every point in time order, its summary."""

    head: RunHead
    points: list[Point]
    summary: dict[str, float]


def exportable(record: RunRecord) -> RunRecord:
    """``record``, or a usage error for a run that has not ended (its export would be a part)."""
    if record.active:
        raise UsageError(f"run {record.id} is still {record.state}: export it when it has ended, "
                         "or follow it live with `mlbench run ... --log-to TOOL:DIR`")
    return record


def run_head(record: RunRecord) -> RunHead:
    """The run's head: catalog fields, then run.json's configuration and environment, flat."""
    raw: dict[str, Any] = {k: getattr(record, k) for k in _CATALOG_PARAMS}
    try:  # as recorded (a document of an older or newer mlbench too), not as this version parses it
        data = read_json(record.run_dir / RUN_JSON)
    except (OSError, ValueError):
        data = None
    if isinstance(data, dict):
        raw["config"] = data.get("config") or {}
        raw["environment"] = data.get("environment") or {}
        if data.get("network"):
            raw["network"] = data["network"]
    result = read_result(record.result)
    metric = result.goal_metric if result is not None else task_metric(record.task)
    # (a run still going, exported live, has no result yet: its task says whether it sweeps)
    spec = TASKS.get(record.task)
    sweep = isinstance(result, AllreduceResult) or (result is None and spec is not None and spec.kind == "allreduce")
    goal_tag = f"result/peak_{metric_key(metric)}" if sweep else f"eval/{metric.name}"
    return RunHead(id=record.id, name=record.name, task=record.task, state=record.state,
                   started_at=record.started_at or record.created_at, group_id=record.group_id,
                   metric=metric, goal_tag=goal_tag, hparams=flatten(raw))


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, str | int | float | bool]:
    """Nested configuration as ``a.b.c`` keys whose values are strings, numbers or booleans
    (what every tool's hyper-parameters accept): a list as its JSON text, None as ``null``."""
    out: dict[str, str | int | float | bool] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = json.dumps(value, sort_keys=True)
    return out


#: The characters a key keeps: those MLflow accepts in a metric's name on every system
#: (``mlflow.utils.validation.validate_param_and_metric_name``), in ASCII; any other becomes ``_``.
_UNSAFE_CHARACTER = re.compile(r"[^A-Za-z0-9_.\- /]")
#: MLflow's longest metric name (``MAX_ENTITY_KEY_LENGTH``); in ASCII, shorter than a file name may be.
MAX_KEY_LENGTH = 250


def safe_key(name: str) -> str:
    """``name`` as a key that every tool takes and that names no file outside its folder.

    Two rules, so that a key still reads as its name: every character outside letters, digits,
    ``_ - .``, space and ``/`` becomes ``_`` (``train/a\\x00b`` -> ``train/a_b``); and in every
    part between slashes, an empty part becomes ``_`` and the leading dots of a part become as
    many ``_`` (``train/../../escape`` -> ``train/__/__/escape``, ``/abs`` -> ``_/abs``,
    ``a//b`` -> ``a/_/b``). Whole characters are replaced, never dropped, so the slashes (the
    tools' sections) stay where they were. The result is a relative path that
    ``posixpath.normpath`` leaves as it is: what MLflow requires of a name
    (``mlflow.utils.validation.path_not_unique``), and a file name in its store that stays in
    the run's folder and is never hidden. mlbench's own names are kept as they are."""
    return "/".join(_safe_part(part) for part in _UNSAFE_CHARACTER.sub("_", name).split("/"))


def _safe_part(part: str) -> str:
    """One part of a name between slashes: never empty, never beginning with a dot."""
    rest = part.lstrip(".")
    return "_" * (len(part) - len(rest)) + rest if part else "_"


class SeriesNames:
    """The keys of one run's series in one export (after the run, or live across its looks): a
    name's :func:`safe_key`, or a usage error of one line when two names would share a key or a
    key would be longer than :data:`MAX_KEY_LENGTH`."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self._keys: dict[str, str] = {}
        self._names: dict[str, str] = {}

    def key(self, name: str) -> str:
        known = self._keys.get(name)
        if known is not None:
            return known
        key = safe_key(name)
        if len(key) > MAX_KEY_LENGTH:
            raise UsageError(f"run {self.run_id}: the metric {_shown(name)} has a name of {len(key)} "
                             f"characters; an exported name has at most {MAX_KEY_LENGTH} (MLflow's limit)")
        other = self._names.setdefault(key, name)
        if other != name:
            raise UsageError(f"run {self.run_id}: the metrics {_shown(other)} and {_shown(name)} would both "
                             f"be exported as {key!r} (docs/exporters.md, \"Names\"): the run cannot be exported")
        self._keys[name] = key
        return key


def _shown(name: str) -> str:
    """A name in a message of one line: quoted, its control characters escaped, at most 80 long."""
    return repr(name if len(name) <= 80 else name[:77] + "...")


def event_points(events: Iterable[dict[str, Any]], names: SeriesNames) -> list[Point]:
    """The points of events (as :mod:`mlbench.results.events` reads them): every number, and
    each row of task 0a's sweep, named by ``names``; objects that are no series (result,
    environment) give none."""
    points = []
    for event in events:
        name, rank = event["name"], event["rank"]
        value: Any = event.get("value")  # of the type its name gives (checked by the readers)
        if name.startswith(NUMERIC_PREFIXES) and math.isfinite(value):
            tag = name if rank == 0 else f"rank{rank}/{name}"
            points.append(Point(names.key(tag), value, event["step"], event["time"]))
        elif name == "allreduce":
            points.extend(sweep_points(value, event["time"], names))
    return points


def sweep_points(row: dict[str, Any], when: float, names: SeriesNames) -> list[Point]:
    """One row of task 0a's sweep: bandwidths in GB/s and the time of one all-reduce in
    microseconds, at the message size in bytes."""
    try:
        dtype, size = str(row["dtype"]), int(row["bytes"])
    except (KeyError, TypeError, ValueError):
        return []
    points = []
    for key, figure in SWEEP_FIGURES.items():
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            points.append(Point(names.key(f"allreduce/{dtype}/{figure}"),
                                1e6 * value if key == "time_s" else value, size, when))
    return points


def metric_key(metric: Metric) -> str:
    """A metric's name in a series name, with its unit: ``accuracy`` (a fraction),
    ``perplexity``, ``bus_bandwidth_gbps``, ``latency_us``."""
    unit = {"GB/s": "_gbps", "us": "_us"}.get(metric.unit, "")
    return metric.name.replace(" ", "_") + unit


def summary_values(record: RunRecord, summary: RunSummary,
                   events: list[dict[str, Any]] | None = None) -> dict[str, float]:
    """The run's figures as `status RUN` reports them (None and non-finite values left out):
    throughput, training time, phases (mean and max over workers), bytes, the result, what
    faults cost (``events``: the run's, when the caller has read them)."""
    values: dict[str, float | int | None] = {
        "summary/steps": summary.steps, "summary/samples": summary.samples,
        "summary/train_time_s": summary.train_time,
        "summary/throughput_samples_per_s": summary.throughput,
        "summary/communication_ratio": summary.communication_ratio,
        "summary/compression_ratio": summary.compression_ratio,
    }
    if summary.bytes_sent:
        values["summary/bytes_sent_per_worker"] = sum(summary.bytes_sent.values()) / len(summary.bytes_sent)
    if summary.ranks and any(summary.phase_seconds.values()):
        for phase, mean, top, _share in phase_table(summary):
            values[f"summary/time_{phase}_mean_s"] = mean
            values[f"summary/time_{phase}_max_s"] = top
    result = read_result(record.result)
    if isinstance(result, TrainingResult):
        key = metric_key(get_metric(result.metric))
        values.update({
            f"result/final_{key}": result.final_accuracy, f"result/best_{key}": result.best_accuracy,
            f"result/goal_{key}": result.goal, "result/final_loss": result.final_loss,
            "result/reached": int(result.reached) if result.goal is not None else None,
            "result/time_to_accuracy_s": result.time_to_accuracy if result.reached else None,
            "result/wall_time_to_accuracy_s": result.wall_time_to_accuracy if result.reached else None,
            "result/train_time_s": result.train_time, "result/eval_time_s": result.eval_time,
            "result/epochs": result.epochs, "result/steps": result.steps,
        })
    elif isinstance(result, AllreduceResult):
        values[f"result/peak_{metric_key(result.goal_metric)}"] = result.headline
        values[f"result/{metric_key(LATENCY)}"] = result.latency_us
        values["result/wrong_elements"] = result.wrong
    faults = run_faults(record, summary, events)
    if had_faults(faults):
        accounting = faults.get("time") or {}
        values.update({
            "faults/goodput": faults.get("goodput"), "faults/restarts": faults.get("restarts"),
            "faults/redone_steps": faults.get("lost_steps"), "faults/applied": faults.get("count"),
            "faults/checkpoint_s": accounting.get("checkpoint_s"), "faults/stalled_s": accounting.get("stalled_s"),
            "faults/link_down_s": accounting.get("link_down_s"),
            "faults/recovery_s": sum(faults.get("recover_s") or []),
        })
    return {k: v for k, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


#: The series of each kind of timeline moment (its count so far, at the moment's step).
FAULT_SERIES = {"fault": "timeline/faults", "missed": "timeline/missed", "restart": "timeline/restarts",
                "shrink": "timeline/shrinks", "resume": "timeline/resumes"}


def fault_points(record: RunRecord, events: list[dict[str, Any]]) -> list[Point]:
    """Each fault, missed fault, restart, shrink and resume of the run as a point at its step."""
    timeline = run_timeline(record, events=events)
    counts: dict[str, int] = {}
    points = []
    for moment in timeline.moments:
        if moment.step is None or timeline.origin is None:
            continue
        counts[moment.kind] = counts.get(moment.kind, 0) + 1
        points.append(Point(FAULT_SERIES[moment.kind], counts[moment.kind], moment.step, timeline.origin + moment.at))
    return points


def last_step(points: list[Point]) -> int:
    """The step the summary is written at: the last training step (0 for a sweep)."""
    return max((p.step for p in points if not p.tag.startswith(("allreduce/", "timeline/"))), default=0)


def exported_run(record: RunRecord) -> ExportedRun:
    """Everything a run recorded, ready for any exporter."""
    events = read_run_events(record.run_dir)
    return ExportedRun(run_head(record), event_points(events, SeriesNames(record.id)) + fault_points(record, events),
                       summary_values(record, summarize(events), events))

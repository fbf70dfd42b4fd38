"""Runs and comparisons as plain data: what `status`, `status RUN` and `compare` print with
``-o json`` or ``-o yaml`` (README, "Machine-readable output"), and what their tables show.

The keys are an interface for scripts: later versions may add keys, never rename or drop one.
Durations are seconds, instants Unix seconds, fractions (accuracy, shares) between 0 and 1; a
value that is unknown, or a goal that was not reached, is null (never NaN or infinity, which
JSON does not have).
"""

from __future__ import annotations

import math
from typing import Any

from mlbench.results.compare import TIME_TO_ACCURACY, Comparison, Group
from mlbench.results.outcome import TrainingResult
from mlbench.results.repeats import RepeatStats
from mlbench.results.store import RunRecord
from mlbench.results.summary import RunSummary, phase_table
from mlbench.tasks.metrics import get_metric
from mlbench.tasks.spec import TASKS


def finite(value: float | None) -> float | None:
    """``value``, or None for None, NaN and infinity (a goal not reached)."""
    return value if value is not None and math.isfinite(value) else None


def goal_metric_name(task: str) -> str:
    """The goal metric of a task by name (a run of a task this version does not know: accuracy)."""
    spec = TASKS.get(task)
    return spec.metric if spec is not None else "accuracy"


def run_overview(record: RunRecord, summary: RunSummary | None = None) -> dict[str, Any]:
    """One run as a row of `mlbench status`: identity, state, and how far it got.

    For an active run, ``summary`` (of its events so far) gives the epoch and the last value of
    the goal metric; an ended run has them in its result.
    """
    result = TrainingResult.from_dict(record.result)
    metric = get_metric(result.metric if result else goal_metric_name(record.task))
    if record.active and summary is not None:
        epoch: float | None = summary.epoch
        value = summary.evaluations[-1].get(metric.name) if summary.evaluations else None
    else:
        epoch = result.epochs if result else None
        value = result.final_accuracy if result else None
    reached = result.reached if result and result.goal is not None else None
    return {
        "id": record.id, "name": record.name, "task": record.task, "workers": record.workers,
        "state": record.state, "reason": record.reason, "division": record.division,
        "optimizer": record.optimizer, "launcher": record.launcher, "seed": record.seed,
        "group_id": record.group_id, "created_at": record.created_at,
        "started_at": record.started_at, "finished_at": record.finished_at,
        "epoch": epoch, "metric": metric.name, "metric_value": value,
        "goal": result.goal if result else None, "goal_reached": reached,
        "time_to_accuracy": result.time_to_accuracy if reached else None,
    }


def run_details(record: RunRecord, summary: RunSummary) -> dict[str, Any]:
    """One run as `mlbench status RUN` shows it: the overview, the summary of its metric events
    over all workers, its result as recorded and the result sentence."""
    phases = {phase: {"mean": mean, "max": top, "share": share}
              for phase, mean, top, share in phase_table(summary)} if summary.ranks else {}
    evals = list(summary.eval_seconds.values())
    sent = list(summary.bytes_sent.values())
    result = TrainingResult.from_dict(record.result)
    return {
        **run_overview(record, summary),
        "summary": {
            "steps": summary.steps, "epoch": summary.epoch, "train_time": summary.train_time,
            "samples": summary.samples, "throughput": summary.throughput,
            "last_train_loss": summary.last_train_loss, "last_lr": summary.last_lr,
            "evaluations": [dict(e) for e in summary.evaluations],
            "phases": phases,
            "evaluation_seconds": ({"mean": sum(evals) / len(evals), "max": max(evals)}
                                   if evals else None),
            "communication_ratio": summary.communication_ratio,
            "bytes_sent_per_worker": sum(sent) / len(sent) if sent else None,
            "compression_ratio": summary.compression_ratio,
            "errors": list(summary.errors),
        },
        "result": record.result,
        "result_sentence": result.sentence() if result else None,
    }


def _stats(stats: RepeatStats) -> dict[str, float | None]:
    return {"median": finite(stats.median), "min": finite(stats.minimum),
            "max": finite(stats.maximum), "olympic_mean": finite(stats.olympic_mean)}


def _group(group: Group) -> dict[str, Any]:
    goal = group.family.metric == TIME_TO_ACCURACY
    tta = group.time_to_accuracy
    return {
        "workers": group.workers, "runs": tta.runs, "run_ids": [r.record.id for r in group.runs],
        "converged": tta.converged if goal else None,
        "time_to_accuracy": _stats(tta) if goal else None,
        "speedup": group.speedup,
        "speedup_range": list(group.speedup_range) if group.speedup_range else None,
        "efficiency": group.efficiency,
        "compute_seconds": group.compute_seconds,
        "communication_seconds": group.communication_seconds,
        "communication_share": group.communication_share,
        "throughput": _stats(group.throughput),
        "final_accuracy": group.final_accuracy,
        "cost_to_accuracy": _stats(group.cost) if goal and group.cost is not None else None,
    }


def comparison_document(comparison: Comparison) -> dict[str, Any]:
    """`mlbench compare` as data: per family (runs that may be compared), one entry per worker
    count with the statistics over its repeats."""
    return {
        "task": comparison.task,
        "usd_per_node_hour": comparison.usd_per_node_hour,
        "families": [{
            "task": family.task, "division": family.division, "optimizer": family.optimizer,
            "hardware": family.hardware, "goal": family.goal, "measure": family.metric,
            "groups": [_group(g) for g in groups],
        } for family, groups in comparison.families().items()],
        "skipped": [{"id": r.id, "state": r.state} for r in comparison.skipped],
    }

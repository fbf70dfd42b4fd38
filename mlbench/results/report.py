"""What `status` and `compare` say about runs, as values and sentences.

One implementation for every view of the run store: the CLI prints these rows and sentences in
its tables, the dashboard (`mlbench dashboard`) shows the same ones in the browser, so a run's
progress, its result sentence and a comparison's table read the same wherever they are looked at.

The same rows as plain data are what `status`, `status RUN` and `compare` print with ``-o json``
or ``-o yaml`` (README, "Machine-readable output"). Those keys are an interface for scripts:
later versions may add keys, never rename or drop one. Durations are seconds, instants Unix
seconds, fractions (accuracy, shares) between 0 and 1; a value that is unknown, or a goal that
was not reached, is null (never NaN or infinity, which JSON does not have).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mlbench.results.compare import TIME_TO_ACCURACY, Comparison, Family, Group
from mlbench.results.events import read_run_events
from mlbench.results.outcome import TrainingResult, fmt_duration
from mlbench.results.repeats import RepeatStats
from mlbench.results.store import RunRecord
from mlbench.results.summary import RunSummary, phase_table, summarize
from mlbench.tasks.metrics import ACCURACY, Metric, get_metric
from mlbench.tasks.registry import TASKS


def fmt_percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def describe_result(result: dict[str, Any] | None) -> str:
    """The one-sentence outcome of a run: time to accuracy, or accuracy after time."""
    outcome = TrainingResult.from_dict(result)
    return outcome.sentence() if outcome else ""


def task_metric(task: str) -> Metric:
    """The goal metric of a task by name (a task this version does not know: accuracy)."""
    spec = TASKS.get(task)
    return get_metric(spec.metric if spec is not None else "accuracy")


# -- one run: a row of `mlbench status` ----------------------------------------------------------
@dataclass
class RunProgress:
    """Where a run stands, as the table of runs shows it."""

    epoch: float | None
    accuracy: float | None           # the last value of the task's goal metric (accuracy, perplexity, BLEU)
    time_to_accuracy: float | None
    throughput: float | None         # training samples/s over all workers; None when unknown
    metric: Metric = ACCURACY


def run_progress(record: RunRecord, summary: RunSummary | None = None) -> RunProgress:
    """From the metric events while a run is active, from its result once it has ended.

    ``summary`` (of the run's events) saves reading them again; without it an ended run has no
    throughput, which the result does not hold.
    """
    if record.active and summary is None:
        summary = summarize(read_run_events(record.run_dir))
    result = TrainingResult.from_dict(record.result)
    metric = result.goal_metric if result else task_metric(record.task)
    throughput = summary.throughput if summary is not None else None
    if record.active and summary is not None:
        value = summary.evaluations[-1].get(metric.name) if summary.evaluations else None
        return RunProgress(summary.epoch, value, None, throughput, metric)
    if result is None:
        return RunProgress(None, None, None, throughput, metric)
    return RunProgress(result.epochs, result.final_accuracy, result.time_to_accuracy, throughput, metric)


# -- several runs: the table of `mlbench compare` ------------------------------------------------
COMPARE_HEADERS = ("WORKERS", "CONVERGED", "TIME TO ACC.", "MIN..MAX", "OLYMPIC MEAN", "SPEEDUP",
                   "EFFICIENCY", "COMPUTE/COMM.", "SAMPLES/S", "ACCURACY", "COST TO ACC.")


def compare_headers(emulated: bool = False) -> tuple[str, ...]:
    """:data:`COMPARE_HEADERS`, with the network column when some family ran on an emulated one."""
    return (COMPARE_HEADERS[0], "NETWORK", *COMPARE_HEADERS[1:]) if emulated else COMPARE_HEADERS


def family_heading(family: Family, emulated: bool = False) -> str:
    """What the runs of one table have in common, and the measure of their speedup
    (``emulated``: some family ran on an emulated network, so each says its network)."""
    metric = ("speedup of time to accuracy" if family.metric == TIME_TO_ACCURACY
              else "no goal: speedup of throughput")
    goal = f"goal {task_metric(family.task).format(family.goal)}" if family.goal is not None else "synthetic data"
    network = f"network {family.network or 'not emulated'} | " if emulated else ""
    return (f"{family.task} | {family.division} division | {family.optimizer} | "
            f"{family.hardware} | {network}{goal} | {metric}")


def compare_row(g: Group, emulated: bool = False) -> list[str]:
    """One worker count of a family, in the columns of :func:`compare_headers`."""
    tta = g.time_to_accuracy
    goal = g.family.metric == TIME_TO_ACCURACY
    share = g.communication_share
    cost = "-" if g.cost is None or not goal else _usd(g.cost.median)
    return [
        str(g.workers),
        *([g.family.network or "-"] if emulated else []),
        f"{tta.converged}/{tta.runs}" if goal else f"-/{tta.runs}",
        _seconds(tta.median) if goal else "-",
        f"{_seconds(tta.minimum)}..{_seconds(tta.maximum)}" if goal and tta.converged else "-",
        _seconds(tta.olympic_mean) if goal else "-",
        f"{g.speedup:.2f}x" if g.speedup is not None else "-",
        f"{100 * g.efficiency:.0f}%" if g.efficiency is not None else "-",
        f"{100 * (1 - share):.0f}% / {100 * share:.0f}%" if share is not None else "-",
        f"{g.throughput.median:.0f}",
        task_metric(g.family.task).format(g.final_accuracy),
        cost,
    ]


def compare_notes(comparison: Comparison) -> list[str]:
    """The sentences under the table: what the columns measure, the price, what was left out."""
    notes = [("Time to accuracy: training time to the goal, evaluation excluded; median over the "
              "repeats, olympic mean without the fastest and slowest run; a run that missed the "
              "goal counts as the slowest.")]
    if comparison.usd_per_node_hour is None:
        notes.append("Cost: local runs cost nothing unless priced (--price-per-hour USD or --instance NAME).")
    else:
        notes.append(f"Cost: node-seconds to the goal (evaluation included) at "
                     f"${comparison.usd_per_node_hour:.4g} per node-hour.")
    if comparison.skipped:
        listed = ", ".join(f"{r.id} ({r.state})" for r in comparison.skipped)
        notes.append(f"Left out {len(comparison.skipped)} run(s) that did not finish: {listed}.")
    return notes


def _seconds(value: float) -> str:
    if not math.isfinite(value):
        return "not reached"
    if value < 1:
        return f"{value:.3f}s"
    return fmt_duration(value)


def _usd(value: float) -> str:
    if not math.isfinite(value):
        return "not reached"
    if value == 0:
        return "$0"
    if value < 0.0001:
        return "<$0.0001"
    return f"${value:.4f}" if value < 1 else f"${value:,.2f}"


# -- the same as plain data: `-o json` and `-o yaml` -------------------------------------------
def finite(value: float | None) -> float | None:
    """``value``, or None for None, NaN and infinity (a goal not reached)."""
    return value if value is not None and math.isfinite(value) else None


def run_overview(record: RunRecord, summary: RunSummary | None = None) -> dict[str, Any]:
    """One run as a row of `mlbench status`: identity, state, and how far it got.

    For an active run, ``summary`` (of its events so far) gives the epoch and the last value of
    the goal metric; an ended run has them in its result.
    """
    result = TrainingResult.from_dict(record.result)
    metric = result.goal_metric if result else task_metric(record.task)
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
        "time_to_accuracy": result.time_to_accuracy if result and reached else None,
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
            "hardware": family.hardware, "network": family.network, "goal": family.goal,
            "measure": family.metric,
            "groups": [_group(g) for g in groups],
        } for family, groups in comparison.families().items()],
        "skipped": [{"id": r.id, "state": r.state} for r in comparison.skipped],
    }

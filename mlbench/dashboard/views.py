"""The dashboard's JSON documents: a row of the runs table, one run's page, a comparison.

Everything here is a view of what :mod:`mlbench.results` computes (``summarize``,
``run_progress``, ``describe_result``, ``compare_runs`` and the rows of `mlbench compare`): values
are passed through, renamed for JSON, never recomputed. Every metric comes with its text as the
CLI formats it (:class:`~mlbench.tasks.metrics.Metric`) and, for the charts, its axis label and
plotted value, so the pages format no metric themselves. Infinite values (a repeat statistic of
runs that missed the goal) become ``null``, which JSON can carry.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from mlbench.frameworks import DEFAULT_FRAMEWORK, transport_of
from mlbench.network.settings import describe_network, network_label
from mlbench.results.charts import family_labels, network_axis, representative
from mlbench.results.compare import Comparison, Group, sweep_bandwidth, training_curve
from mlbench.results.outcome import AllreduceResult, read_result
from mlbench.results.report import (bandwidth_matrix, compare_headers, compare_notes, compare_row, describe_checkpoints,
                                    describe_plugin, describe_result, describe_resumes, run_recovery,
                                    framework_of, difference_lines, differs_in_network, family_heading, group_label,
                                    had_faults, is_sweep, no_time_to_goal, phases_not_measured,
                                    run_progress, sweep_table, task_metric, throughput_unit)
from mlbench.results.division import run_division
from mlbench.results.fairness import group_flags
from mlbench.results.repeats import RepeatStats
from mlbench.results.goodput import describe_faults, run_faults, run_workers_label
from mlbench.results.store import RunRecord
from mlbench.results.summary import RunSummary, phase_table
from mlbench.results.sysmetrics import describe_system, system_metrics
from mlbench.run_config import RunConfig, RunDocument
from mlbench.tasks.task0a.sweep import TABLE_HEADERS, table_row
from mlbench.tasks.metrics import LATENCY, Metric

LOG_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def read_run_json(record: RunRecord) -> dict[str, Any]:
    """The run's run.json, read through :class:`RunDocument` (empty when missing or unreadable)."""
    document = RunDocument.load_or_none(record.run_dir)
    return document.to_dict() if document else {}


def run_network(run_json: dict[str, Any]) -> str | None:
    """The run's emulated network as the CLI labels it (``10 Mbit/s, 5 ms``); None: not shaped."""
    return network_label(run_json.get("network")) or None


def metric_view(metric: Metric, goal: float | None = None) -> dict[str, Any]:
    """What a page needs to show a metric: its description, and the goal as text and as
    plotted (percent for a fraction)."""
    return {**metric.describe(), "goal_text": metric.describe_goal(goal) if goal is not None else None,
            "goal_display": metric.display(goal) if goal is not None else None}


def result_sentence(record: RunRecord, summary: RunSummary | None = None) -> str | None:
    """`status`'s result line; the reason when the run failed or was cancelled."""
    result = record.result or (summary.result if summary else None)
    if result and not record.active:
        try:
            return describe_result(result)
        except (KeyError, TypeError, ValueError):
            return None
    if record.reason:
        return f"Run {record.state}: {record.reason}"
    return None


def run_row(source_key: str, record: RunRecord, summary: RunSummary | None,
            run_json: dict[str, Any]) -> dict[str, Any]:
    """One row of the runs table: the columns of `mlbench status` plus throughput and network."""
    progress = run_progress(record, summary)
    config = run_json.get("config") or {}
    division = run_division(record)
    goal = _goal(config, record)
    return {
        "id": record.id, "name": record.name, "task": record.task, "workers": record.workers,
        "workers_text": run_workers_label(record, run_json), "state": record.state, "reason": record.reason,
        "division": division.name, "division_text": division.text,
        "optimizer": record.optimizer, "framework": framework_of(record), "launcher": record.launcher,
        "source": source_key,
        "device": config.get("device"), "network": run_network(run_json),
        "epoch": progress.epoch, "accuracy": progress.accuracy,
        "metric": progress.metric.name, "metric_value": progress.accuracy, "metric_text": progress.metric_text,
        "time_to_accuracy": progress.time_to_accuracy, "goal": goal,
        "no_time_to_goal": no_time_to_goal(record.state, goal),
        "throughput": progress.throughput, "throughput_unit": throughput_unit(record.task),
        "created_at": record.created_at, "started_at": record.started_at,
        "finished_at": record.finished_at, "group_id": record.group_id,
    }


def _goal(config: dict[str, Any], record: RunRecord) -> float | None:
    if record.result and "goal" in record.result:
        return record.result["goal"]
    try:
        return RunConfig.from_dict(config).goal
    except (KeyError, TypeError, ValueError):
        return None


def run_spec(record: RunRecord, run_json: dict[str, Any], summary: RunSummary) -> dict[str, Any]:
    """What was asked for (run.json) and where it ran."""
    config = run_json.get("config") or {}
    environment = summary.environment or run_json.get("environment") or {}
    task = config.get("task") or {}
    goal = _goal(config, record)
    return {
        "task": record.task, "title": task.get("title"),
        "model": task.get("model") or (task.get("settings") or {}).get("model"),
        "framework": framework_of(record),
        "workers": record.workers, "workers_text": run_workers_label(record, run_json),
        "threads_per_worker": config.get("threads_per_worker"),
        "optimizer": record.optimizer, "optimizer_options": config.get("optimizer_options") or {},
        "plugin": describe_plugin(config.get("optimizer_plugin")),
        "plugin_sha256": (config.get("optimizer_plugin") or {}).get("sha256"),
        "model_plugin": describe_plugin(config.get("model_plugin")),
        "model_plugin_sha256": (config.get("model_plugin") or {}).get("sha256"),
        "division": run_division(record).name, "changed": list(run_division(record).reasons),
        "device": config.get("device"),
        "backend": transport_of(config.get("framework") or DEFAULT_FRAMEWORK, config.get("backend") or ""),
        "data": config.get("data"), "data_dir": config.get("data_dir"),
        "light": config.get("light"), "goal": goal,
        "metric": metric_view(run_metric(record), goal),
        "stop_at_goal": config.get("stop_at_goal"), "time_budget_s": config.get("time_budget_s"),
        "max_steps": config.get("max_steps"), "log_every": config.get("log_every"), "seed": record.seed,
        "network": run_network(run_json), "network_text": describe_network(run_json.get("network")),
        "placement": run_json.get("placement"),
        "host": environment.get("host"), "cpu": environment.get("cpu"),
        "cores": environment.get("cores"), "gpus": environment.get("gpus") or [],
        "command": run_json.get("command"),
        **_recovery_texts(record),
        # faults, recovery, goodput and stragglers: the rows of `mlbench status RUN`
        "faults": [list(row) for row in describe_faults(run_faults(record, summary))],
    }


def run_system(summary: RunSummary) -> dict[str, Any] | None:
    """The run's systems metrics (peak memory, step-time spread, FLOP/s) as numbers and as the
    rows of `status RUN` (mlbench.results.sysmetrics); None before any rank recorded them."""
    metrics = system_metrics(summary)
    if metrics is None:
        return None
    data = metrics.to_dict()
    return {**data, "rows": [list(row) for row in describe_system(data)]}


def _recovery_texts(record: RunRecord) -> dict[str, str | None]:
    """The run's checkpoints and resumes in the words of `mlbench status RUN`."""
    recovery = run_recovery(record)
    return {"checkpoints": describe_checkpoints(recovery["checkpoints"]),
            "resumes": describe_resumes(recovery["resumes"])}


def run_metric(record: RunRecord) -> Metric:
    """The metric the run is judged by (its result's, else its task's)."""
    result = read_result(record.result)
    return result.goal_metric if result else task_metric(record.task)


def run_summary(record: RunRecord, summary: RunSummary) -> dict[str, Any]:
    """Progress (the last value of the run's goal metric), phase times per worker (mean, max,
    each rank), throughput in the task's unit and bytes sent (with the compression the summary
    measured)."""
    metric, task, compression = run_metric(record), record.task, summary.compression_ratio
    phases = [{"phase": p, "mean": m, "max": mx, "share": share,
               "ranks": [summary.phase_seconds.get(r, {}).get(p, 0.0) for r in summary.ranks]}
              for p, m, mx, share in phase_table(summary)]
    evals = [summary.eval_seconds.get(r, 0.0) for r in summary.ranks]
    last = summary.evaluations[-1] if summary.evaluations else {}
    sent = [summary.bytes_sent.get(r, 0) for r in summary.ranks]
    return {
        "ranks": summary.ranks, "epoch": summary.epoch, "steps": summary.steps,
        "train_time": summary.train_time, "last_train_loss": summary.last_train_loss,
        "last_accuracy": last.get("accuracy"), "last_test_loss": last.get("loss"),
        "test_loss_is_metric": metric.name == "val_loss",   # the row above shows it
        "last_metric_title": f"last {metric.title}",
        "last_metric_text": metric.format(last.get(metric.name)) if summary.evaluations else None,
        "throughput": summary.throughput, "throughput_unit": throughput_unit(task),
        "communication_ratio": summary.communication_ratio,
        "phases": phases, "phases_note": phases_not_measured(record, summary),
        "evaluation": {"mean": sum(evals) / len(evals) if evals else 0.0,
                       "max": max(evals, default=0.0), "ranks": evals},
        "bytes_sent": sent, "bytes_sent_mean": sum(sent) / len(sent) if sent else 0.0,
        "compression": compression, "errors": summary.errors,
    }


def run_series(record: RunRecord, events: list[dict[str, Any]], summary: RunSummary) -> dict[str, list]:
    """The curves of the run's page: rank 0's logging intervals and the evaluations (``accuracy``:
    the goal metric's value, whatever the metric, as result records name it; ``value``: as
    plotted; ``text``: as shown)."""
    metric = run_metric(record)
    evaluations = [{"time": e.get("time"), "epoch": e["epoch"], "step": e["step"],
                    "accuracy": e[metric.name], "value": metric.display(e[metric.name]),
                    "text": metric.format(e[metric.name]), "loss": e.get("loss")}
                   for e in summary.evaluations if metric.name in e]
    return {"training": training_curve(events, record.workers), "evaluations": evaluations}


def run_sweep(record: RunRecord) -> dict[str, Any] | None:
    """Task 0a's sweep for its page: the table of `mlbench status RUN` and the bandwidth per
    message size per dtype (the figure); None for a training run."""
    sweep = read_result(record.result)
    if not isinstance(sweep, AllreduceResult):
        return None
    lines: dict[str, list[list[float]]] = {}
    for row in sweep.rows:
        lines.setdefault(row["dtype"], []).append([row["bytes"], sweep.bandwidth(row)])
    metric = sweep.goal_metric
    return {"headers": list(TABLE_HEADERS), "rows": [[str(c) for c in table_row(r)] for r in sweep.rows],
            "metric": metric.describe(), "peak_text": metric.format(sweep.headline),
            "latency_text": LATENCY.format(sweep.latency_us),
            "lines": [{"label": dtype, "points": points} for dtype, points in lines.items()]}


def log_names(record: RunRecord) -> list[str]:
    folder = Path(record.run_dir) / "logs"
    if not folder.is_dir():
        return []
    names = [p.name for p in folder.iterdir() if p.is_file() and set(p.name) <= LOG_NAME_CHARS]
    return sorted(names, key=lambda n: (not n.startswith("rank-"), len(n), n))


# -- compare ------------------------------------------------------------------------------------
def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _stats(stats: RepeatStats | None) -> dict[str, Any] | None:
    if stats is None:
        return None
    return {"median": _finite(stats.median), "min": _finite(stats.minimum),
            "max": _finite(stats.maximum), "runs": stats.runs, "converged": stats.converged}


def _group(g: Group, emulated: bool, metric: Metric, faults: bool, score: str) -> dict[str, Any]:
    lead = representative(g)
    sizes = {(row["dtype"], int(row["elements"])): int(row["bytes"])
             for run in g.runs if run.sweep for row in run.sweep.rows}
    return {
        "workers": g.workers, "label": group_label(g, emulated), "network": g.family.network or None,
        "speedup": g.speedup,
        "speedup_range": list(g.speedup_range) if g.speedup_range else None,
        "efficiency": g.efficiency, "cost": _stats(g.cost),
        "time_to_accuracy": _stats(g.time_to_accuracy), "throughput": _stats(g.throughput),
        "compute_seconds": g.compute_seconds, "communication_seconds": g.communication_seconds,
        "communication_share": g.communication_share, "final_accuracy": g.final_accuracy,
        "goodput": g.goodput, "restarts": g.restarts, "lost_steps": g.lost_steps,
        "row": compare_row(g, emulated, faults, score),
        "flags": group_flags(g),
        "sweep": [{"dtype": dtype, "bytes": sizes[(dtype, elements)], "value": value}
                  for (dtype, elements), value in sweep_bandwidth(g).items()],
        "runs": [{"id": run.record.id, "name": run.record.name, "lead": run is lead,
                  "losses": [list(p) for p in run.losses],
                  "evaluations": [[e["time"], metric.display(e[metric.name])] for e in run.summary.evaluations
                                  if "time" in e and metric.name in e]}
                 for run in g.runs],
    }


def comparison_document(comparison: Comparison) -> dict[str, Any]:
    """The tables of `mlbench compare` (task 0a's by message size too) and the data of the
    figures of `mlbench charts` (``network``: the setting the network figure's x axis shows,
    when the runs differ in bandwidth or latency)."""
    families = comparison.families()
    labels = family_labels(list(families))
    # the network figure's lines: what tells families apart besides their network
    plain = {f: dataclasses.replace(f, network="", bandwidth_bps=None, latency_s=0.0) for f in families}
    line_labels = family_labels(list(dict.fromkeys(plain.values())))
    emulated = differs_in_network(comparison)
    sweep = is_sweep(comparison)
    faults = had_faults(comparison)
    metric = task_metric(comparison.task)
    differing = tuple(key for key, _ in comparison.differences())
    sweep_headers, sweep_rows = sweep_table(comparison) if sweep else ([], [])
    matrix = bandwidth_matrix(comparison)
    return {
        "task": comparison.task,
        "headers": list(compare_headers(emulated, sweep, faults, comparison.task, comparison.score)),
        "score": comparison.score,
        "throughput_unit": throughput_unit(comparison.task),
        "usd_per_node_hour": comparison.usd_per_node_hour,
        "notes": compare_notes(comparison),
        "differences": difference_lines(comparison),
        # the configuration diff: each fingerprint key the families differ in, its text per
        # family (in the order of "families"), as `mlbench compare -o json` gives it
        "config_diff": [{"key": key, "values": values} for key, values in comparison.differences()],
        "pooled": list(comparison.pooled),
        "skipped": [{"id": r.id, "state": r.state} for r in comparison.skipped],
        "metric": metric_view(metric), "sweep": sweep,
        "sweep_table": {"headers": sweep_headers, "rows": sweep_rows} if sweep else None,
        "bandwidth_table": {"headers": matrix[0], "rows": matrix[1]} if matrix else None,
        "network": network_axis(comparison),
        "families": [{"label": labels[f], "heading": family_heading(f, emulated, faults, differing, comparison.pooled),
                      "metric": f.metric, "fingerprint": dict(f.fingerprint),
                      "goal": f.goal, "goal_text": metric.format(f.goal) if f.goal is not None else None,
                      "goal_display": metric.display(f.goal) if f.goal is not None else None,
                      "network": f.network or None, "bandwidth_bps": f.bandwidth_bps,
                      "latency_s": f.latency_s, "faults": f.faults or None,
                      "line": line_labels[plain[f]],
                      "groups": [_group(g, emulated, metric, faults, comparison.score) for g in groups]}
                     for f, groups in families.items()],
    }

"""How runs look on the terminal: progress lines while training, and the details of one run."""

from __future__ import annotations

import datetime
from typing import Any

import click

from mlbench.cli.output import tabulate
from mlbench.launch.plan import RunRequest
from mlbench.frameworks import transport_of
from mlbench.results.report import (
    describe_checkpoints,
    describe_plugin,
    describe_result,
    describe_resumes,
    fmt_duration,
    framework_of,
    no_time_to_goal,
    phases_not_measured,
    run_plugins,
    run_recovery,
    task_metric,
    throughput_text,
    throughput_unit,
)
from mlbench.results.goodput import describe_faults, had_faults, recoveries, run_faults, run_workers_label
from mlbench.results.store import RunRecord
from mlbench.network.settings import describe_network, network_label
from mlbench.results.summary import RunSummary, StepGaps, phase_table
from mlbench.results.sysmetrics import describe_system, system_metrics
from mlbench.results.timeline import ERROR_CHARS, run_timeline, timeline_lines
from mlbench.results.division import Division, run_division
from mlbench.run_config import RunDocument
from mlbench.tasks.metrics import get_metric


def fmt_time(timestamp: float | None) -> str:
    if not timestamp:
        return "-"
    return datetime.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M")


def fmt_bytes(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"


def division_words(division: Division) -> str:
    """``closed division``, or ``open division (REASON; REASON)`` for a progress line."""
    why = f" ({'; '.join(division.reasons)})" if division.reasons else ""
    return f"{division.name} division{why}"


def division_cell(row: dict[str, Any]) -> str:
    """A run's division in a table cell: ``closed``, or ``open:`` and its first reason, with how
    many more there are (`status RUN` and ``-o json`` list them all)."""
    reasons = row.get("open_reasons") or []
    if row["division"] != "open" or not reasons:
        return str(row["division"])
    first = str(reasons[0]).split("; ")[0]
    more = len(reasons) - 1 + str(reasons[0]).count("; ")
    return f"open: {first}" + (f" (+{more} more)" if more else "")


def state_cell(row: dict[str, Any]) -> str:
    """``finished``, or ``finished (2 restarts)`` for a run whose group started again after failures."""
    count = row.get("restarts") or 0
    return f"{row['state']} ({count} restart{'s' if count != 1 else ''})" if count else str(row["state"])


def time_to_goal_cell(row: dict[str, Any]) -> str:
    """The time to the goal; else why there is none (:func:`~mlbench.results.report.no_time_to_goal`)."""
    if row.get("time_to_accuracy") is not None:
        return fmt_duration(row["time_to_accuracy"])
    return no_time_to_goal(row["state"], row.get("goal"))


def status_table(runs: list[dict[str, Any]]) -> str:
    """The table of `mlbench status`, from :func:`mlbench.results.report.run_overview` rows (an
    open run's division cell says its first reason: ``open: optimizer=my-sgd@1a2b3c4d5e6f``)."""
    rows = [[r["id"], r["name"], r["task"], r["framework"], r["workers_text"], r.get("network") or "-",
             state_cell(r), division_cell(r), f"{r['epoch']:.2f}" if r["epoch"] is not None else "-",
             r["metric_text"], time_to_goal_cell(r), fmt_time(r["created_at"])]
            for r in runs]
    return tabulate(rows, headers=["ID", "NAME", "TASK", "FRAMEWORK", "WORKERS", "NETWORK", "STATE", "DIVISION",
                                   "EPOCH", "METRIC", "TIME TO GOAL", "CREATED"], disable_numparse=True)


class ProgressPrinter:
    """Prints rank 0's events as progress lines while a run trains (the launcher's callback, and
    `mlbench status RUN --follow`)."""

    def __init__(self, run: RunRecord, request: RunRequest | None = None):
        self.run = run
        self.request = request
        self._last_time: float | None = None
        self._samples = 0
        self._gaps = StepGaps()   # a restarted group's first interval counts from its checkpoint
        self._train_time = 0.0
        self.metric = task_metric(run.task)
        self.unit = throughput_unit(run.task)

    def header(self) -> None:
        config = RunDocument.load(self.run.run_dir).config
        goal = config.goal
        metric = get_metric(config.task.metric)
        goal_text = ("no goal (synthetic data)" if goal is None
                     else f"goal {metric.describe_goal(goal)}")
        budget = f", time budget {fmt_duration(config.time_budget_s)}" if config.time_budget_s else ""
        click.echo(f"Run {self.run.id} ({self.run.name}): {self.run.task}, {self.run.workers} worker(s) "
                   f"x {config.threads_per_worker} thread(s), {config.device}/"
                   f"{transport_of(config.framework, config.backend)}, "
                   f"{division_words(run_division(self.run))}, {goal_text}{budget}{network_note(self.run)}")

    def __call__(self, event: dict[str, Any]) -> None:
        name, value = event["name"], event["value"]
        if name == "train/steps":
            self._gaps.steps(0, int(event["step"]), int(value))
        elif name == "train/samples":
            self._samples += self._gaps.samples(0, int(event["step"]), int(value)) * self.run.workers
        elif name == "train/loss":
            self._loss = float(value)
        elif name == "train/time" and hasattr(self, "_loss"):
            now = float(value)
            rate = ""
            if self._last_time is not None and now > self._last_time:
                rate = f"  {self._samples / (now - self._last_time):8.0f} {self.unit}"
            self._last_time = now
            self._samples = 0
            click.echo(f"  epoch {event['epoch']:7.2f}  step {event['step']:>7}  "
                       f"loss {self._loss:.4f}{rate}  train {fmt_duration(now)}")
            del self._loss
        elif name == f"eval/{self.metric.name}":
            click.echo(f"  epoch {event['epoch']:7.2f}  {self.metric.title} {self.metric.format(value)}")
        elif name == "error":   # one line; the whole error is in `mlbench status RUN` and the worker's log
            line = f"worker {event['rank']}: {value}"
            cut = f"{line[:ERROR_CHARS - 3]}..." if len(line) > ERROR_CHARS else line
            click.echo(f"  {cut}", err=True)

    def footer(self, final: RunRecord, summary: RunSummary) -> None:
        if final.state == "finished" and final.result:
            click.echo(describe_result(final.result))
        elif final.state == "cancelled":
            click.echo(f"Run {final.id} cancelled; what it recorded is kept (mlbench status {final.id}).", err=True)
        else:
            click.echo(f"Run {final.id} {final.state}: {final.reason}", err=True)
        faults = run_faults(final, summary)
        if had_faults(faults):
            goodput = f"; goodput {100 * faults['goodput']:.1f}%" if faults["goodput"] is not None else ""
            click.echo(f"Faults: {faults['count']} applied, {recoveries(faults)}, {faults['lost_steps']} steps "
                       f"redone{goodput}. Timeline: mlbench status {final.id}")
        if summary.ranks and final.state != "cancelled":
            ratio = summary.communication_ratio
            extra = f", communication/compute {ratio:.2f}" if ratio is not None else ""
            click.echo(f"Throughput {throughput_text(summary.throughput, final.task)}{extra}. "
                       f"Details: mlbench status {final.id}")


def network_note(run: RunRecord) -> str:
    """``, network 1 Gbit/s, 0.5 ms (emulated)`` for the header of a run with one."""
    document = RunDocument.load_or_none(run.run_dir)
    label = network_label(document.extra.get("network") if document else None)
    return f", network {label} (emulated)" if label else ""


def print_run_details(run: RunRecord, summary: RunSummary, events: list[dict[str, Any]] | None = None) -> None:
    """`mlbench status RUN` as a table (``events``: the run's, as ``summary`` was made of them)."""
    rows = [["id", run.id], ["name", run.name], ["task", run.task], ["framework", framework_of(run)],
            ["workers", run_workers_label(run)],
            ["state", run.state + (f" ({run.reason})" if run.reason else "")],
            ["division", run_division(run).text], ["optimizer", run.optimizer],
            ["launcher", run.launcher], ["created", fmt_time(run.created_at)],
            ["started", fmt_time(run.started_at) if run.started_at else "not yet" if run.active else "-"],
            ["epoch", f"{summary.epoch:.2f}"], ["steps", summary.steps],
            ["training time", fmt_duration(summary.train_time)]]
    plugins = run_plugins(run)
    for kind, label in (("model", "model plug-in"), ("optimizer", "plug-in")):
        if kind in plugins:
            rows.insert(8, [label, describe_plugin(plugins[kind])])
    if summary.last_train_loss is not None:
        rows.append(["last training loss", f"{summary.last_train_loss:.4f}"])
    if summary.evaluations:
        last = summary.evaluations[-1]
        metric = task_metric(run.task)
        rows.append([f"last {metric.title}", f"{metric.format(last.get(metric.name))} (epoch {last['epoch']:.2f})"])
        if metric.name != "val_loss":   # else the row above is that loss
            rows.append(["last test loss", f"{last.get('loss', float('nan')):.4f}"])
    if summary.throughput:
        rows.append(["throughput", f"{throughput_text(summary.throughput, run.task)} (all workers)"])
    document = RunDocument.load_or_none(run.run_dir)
    rows.append(["network", describe_network(document.extra.get("network") if document else None)])
    recovery = run_recovery(run)
    for label, text in (("checkpoints", describe_checkpoints(recovery["checkpoints"])),
                        ("resumes", describe_resumes(recovery["resumes"]))):
        if text:
            rows.append([label, text])
    for label, text in describe_faults(run_faults(run, summary)):
        rows.append([label, text])
    system = system_metrics(summary)
    rows.extend([label, text] for label, text in describe_system(system.to_dict() if system else None))
    if run.result:
        rows.append(["result", describe_result(run.result)])
    click.echo(tabulate(rows, tablefmt="plain"))
    untimed = phases_not_measured(run, summary)
    if untimed:
        click.echo(f"\nTime per phase: {untimed}.")
    elif summary.ranks and any(summary.phase_seconds.values()):
        click.echo("\nTime per phase over all workers (seconds):")
        table = [[p, f"{m:.2f}", f"{mx:.2f}", f"{100 * share:.1f}%"] for p, m, mx, share in phase_table(summary)]
        eval_mean = sum(summary.eval_seconds.values()) / max(1, len(summary.eval_seconds))
        table.append(["evaluation", f"{eval_mean:.2f}", f"{max(summary.eval_seconds.values(), default=0):.2f}", ""])
        click.echo(tabulate(table, headers=["phase", "mean", "max", "share of step"]))
        ratio = summary.communication_ratio
        if ratio is not None:
            sent = sum(summary.bytes_sent.values()) / max(1, len(summary.bytes_sent))
            click.echo(f"\nCompute vs communication: communication/compute = {ratio:.3f}; "
                       f"{fmt_bytes(sent)} sent per worker")
    timeline = run_timeline(run, document, events)
    if timeline.moments:
        click.echo("\nFaults and recovery (seconds since the first start; each failure's errors under it):")
        click.echo("\n".join(timeline_lines(timeline)))
    if timeline.errors:
        click.echo("\nErrors:\n  " + "\n  ".join(timeline.errors))
    if summary.skipped_events:
        click.echo(f"\nSkipped {summary.skipped_events} unreadable metric event lines (not JSON, or "
                   "fields of the wrong type).")


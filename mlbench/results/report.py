"""What `status` and `compare` say about runs, as values and sentences.

One implementation for every view of the run store: the CLI prints these rows and sentences in
its tables, the dashboard (`mlbench dashboard`) shows the same ones in the browser, so a run's
progress, its result sentence and a comparison's table read the same wherever they are looked at.

The same rows as plain data are what `status`, `status RUN` and `compare` print with ``-o json``
or ``-o yaml`` (docs/scripting.md, "Machine-readable output"). Those keys are an interface for scripts:
later versions may add keys, never rename or drop one. Durations are seconds, instants Unix
seconds, fractions (accuracy, shares) between 0 and 1; a value that is unknown, or a goal that
was not reached, is null (never NaN or infinity, which JSON does not have).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median
from typing import Any, TypeGuard

from mlbench.errors import UsageError
from mlbench.frameworks import DEFAULT_FRAMEWORK, get_framework
from mlbench.results.compare import (MEDIAN, MLPERF, TIME_TO_ACCURACY, Comparison, Family, Group,
                                     sweep_bandwidth, sweep_latency)
from mlbench.results.checkpoints import checkpoint_root
from mlbench.results.checkpoints import summary as checkpoint_summary
from mlbench.results.division import run_division
from mlbench.results.fairness import fairness_notes, group_flags
from mlbench.network.settings import format_rate, network_label
from mlbench.results.fingerprint import NAMED_KEYS, follows_optimizer
from mlbench.results.events import read_run_events
from mlbench.results.timeline import run_timeline
from mlbench.results.goodput import run_faults, run_restarts, run_workers_label
from mlbench.results.outcome import AllreduceResult, Outcome, fmt_duration, read_result
from mlbench.results.repeats import RepeatStats
from mlbench.plugins import SHORT_HASH, plugin_label
from mlbench.results.store import ACTIVE_STATES, RunRecord
from mlbench.results.summary import RunSummary, phase_table, summarize
from mlbench.results.sysmetrics import format_bytes, format_fraction, system_metrics
from mlbench.tasks.metrics import ACCURACY, LATENCY, Metric, get_metric
from mlbench.run_config import RunDocument
from mlbench.tasks.registry import TASKS


def describe_result(result: dict[str, Any] | None) -> str:
    """The one-sentence outcome of a run: time to accuracy, accuracy after time, or task 0a's
    peak bandwidth."""
    outcome = read_result(result)
    return outcome.sentence() if outcome else ""


def task_metric(task: str) -> Metric:
    """The goal metric of a task by name (a task this version does not know: accuracy)."""
    spec = TASKS.get(task)
    return get_metric(spec.metric if spec is not None else "accuracy")


def throughput_unit(task: str) -> str:
    """What a task's throughput counts per second: "images/s" (task 1a), "examples/s" (2a),
    "tokens/s" (3a), "target tokens/s" (4b); "samples/s" for a task this version does not
    know and for task 0a, which trains nothing."""
    return f"{getattr(TASKS.get(task), 'sample_unit', 'samples')}/s"


def throughput_text(value: float | None, task: str) -> str:
    """``134834 target tokens/s``, or "-" when unknown."""
    return f"{value:.0f} {throughput_unit(task)}" if value else "-"


# -- one run: a row of `mlbench status` ----------------------------------------------------------
@dataclass
class RunProgress:
    """Where a run stands, as the table of runs shows it."""

    epoch: float | None
    accuracy: float | None           # the last value of the task's goal metric (accuracy, perplexity, BLEU)
    time_to_accuracy: float | None
    throughput: float | None         # training samples/s over all workers; None when unknown
    metric: Metric = ACCURACY

    @property
    def metric_text(self) -> str:
        """The value as a table of runs of any task shows it ('81.20%', 'ppl 915.69', '12.40 GB/s')."""
        return self.metric.cell(self.accuracy)


def has_final_result(result: Outcome | None, record: RunRecord) -> TypeGuard[Outcome]:
    """Whether a run's progress is its result's: it ended with one. Otherwise -- while it is
    active, and when it ended without one (cancelled, failed, killed) -- how far it got and the
    last value of its goal metric are read from the events it recorded."""
    return result is not None and not record.active


def headline(record: RunRecord, summary: RunSummary | None) -> tuple[Metric, float | None, Outcome | None]:
    """The metric a run is judged by, its value so far (the last evaluation of an active run, or
    of one that ended without a result; the result's headline otherwise) and the result."""
    result = read_result(record.result)
    metric = result.goal_metric if result else task_metric(record.task)
    if has_final_result(result, record):
        value = result.headline
    else:
        value = summary.evaluations[-1].get(metric.name) if summary is not None and summary.evaluations else None
    return metric, value, result


def run_summary(record: RunRecord, summary: RunSummary | None = None) -> RunSummary | None:
    """``summary``, or the summary of the run's events when its progress is read from them
    (not :func:`has_final_result`) and none was given; None for a run whose result says it all."""
    if summary is None and not has_final_result(read_result(record.result), record):
        summary = summarize(read_run_events(record.run_dir))
    return summary


def epoch_so_far(record: RunRecord, summary: RunSummary | None) -> float | None:
    """The epoch a run's events reached; None for an ended run that recorded no step."""
    if summary is None or not (record.active or summary.steps):
        return None
    return summary.epoch


def run_progress(record: RunRecord, summary: RunSummary | None = None) -> RunProgress:
    """From the metric events while a run is active or when it ended without a result, from its
    result otherwise.

    ``summary`` (of the run's events) saves reading them again; without it an ended run has no
    throughput, which the result does not hold.
    """
    summary = run_summary(record, summary)
    metric, value, result = headline(record, summary)
    throughput = summary.throughput if summary is not None else None
    if has_final_result(result, record):
        return RunProgress(result.epochs, value, result.time_to_accuracy, throughput, metric)
    return RunProgress(epoch_so_far(record, summary), value, None, throughput, metric)


# -- several runs: the table of `mlbench compare` ------------------------------------------------
COMPARE_HEADERS = ("WORKERS", "CONVERGED", "TIME TO GOAL", "MIN..MAX", "95% CI", "SPEEDUP",
                   "EFFICIENCY", "COMPUTE/COMM.", "SAMPLES/S", "PEAK MEM", "MFU", "METRIC",
                   "COST TO GOAL")
#: Added when some compared run had faults: goodput (training time / wall time), restarts and
#: steps lost and redone per run, medians over the repeats (mlbench.results.goodput).
FAULT_HEADERS = ("GOODPUT", "RESTARTS", "STEPS LOST")
#: Task 0a's table: per worker count its headline figures over the repeats (medians).
SWEEP_HEADERS = ("WORKERS", "RUNS", "PEAK BANDWIDTH", "LATENCY")


def is_sweep(comparison: Comparison) -> bool:
    """Whether the runs compared are task 0a's all-reduce sweeps (compared by message size)."""
    return any(run.sweep is not None for g in comparison.groups for run in g.runs)


def differs_in_network(comparison: Comparison) -> bool:
    """Whether some runs ran on an emulated network: then every heading, row and legend names
    its network, so that runs at 10 and 100 Mbit/s never read alike."""
    return any(g.family.network for g in comparison.groups)


def had_faults(comparison: Comparison) -> bool:
    """Whether some run compared was put through faults or restarted: then every table shows
    what they cost (:data:`FAULT_HEADERS`) and every heading its fault setting."""
    return any(g.had_faults for g in comparison.groups)


def compare_headers(emulated: bool = False, sweep: bool = False, faults: bool = False,
                    task: str = "", score: str = MEDIAN) -> tuple[str, ...]:
    """The columns of a family's table (task 0a's ``sweep``), with the network column when some
    family ran on an emulated one and the goodput columns when some run had ``faults``; the
    throughput column names ``task``'s unit (IMAGES/S, TOKENS/S...); with ``score`` mlperf the
    time column is MLPerf's score of the repeats."""
    renamed = {"SAMPLES/S": throughput_unit(task).upper(),
               "TIME TO GOAL": "MLPERF TIME" if score == MLPERF else "TIME TO GOAL"}
    headers = SWEEP_HEADERS if sweep else tuple(renamed.get(h, h) for h in COMPARE_HEADERS)
    if faults and not sweep:
        headers = (*headers, *FAULT_HEADERS)
    return (headers[0], "NETWORK", *headers[1:]) if emulated else headers


def family_heading(family: Family, emulated: bool = False, faults: bool = False,
                   differing: tuple[str, ...] = (), pooled: tuple[str, ...] = ()) -> str:
    """What the runs of one table have in common, and the measure of their speedup
    (``emulated``: some family ran on an emulated network, so each says its network;
    ``faults``: some run had faults, so each says its --inject and --on-failure;
    ``differing``: the fingerprint keys that tell the families shown apart, each said with this
    family's value unless the heading names it anyway; ``pooled``: the keys pooled on purpose,
    which its runs may differ in)."""
    own = "".join(f" | {key} {family.setting(key)}" for key in differing
                  if key not in NAMED_KEYS and family.has_setting(key))
    joined = f" | pooled across {', '.join(pooled)}" if pooled else ""
    return _heading(family, emulated, faults) + own + joined


def difference_lines(comparison: Comparison) -> list[str]:
    """The lines above compare's tables: which settings tell the families apart (a
    configuration diff), and what was pooled on purpose. Nothing is said when all is alike."""
    lines = []
    differences = comparison.differences()
    fingerprints = [dict(f.fingerprint) for f in comparison.families()]
    own_options = [key for key, _ in differences if follows_optimizer(key, fingerprints)]
    said = [(key, values) for key, values in differences if key not in own_options]
    if differences:
        lines.append(f"The {len(comparison.families())} families differ in: "
                     + "; ".join(f"{key} ({' | '.join(values)})" for key, values in said)
                     + ("; and each optimizer's own options (in its heading)" if own_options else "") + ".")
    if comparison.pooled:
        lines.append(f"Pooled on purpose (--pool): runs that differ in {', '.join(comparison.pooled)} share a row.")
    return lines


def _heading(family: Family, emulated: bool, faults: bool) -> str:
    network = f"network {family.network or 'not emulated'} | " if emulated else ""
    if faults:
        network += f"{family.faults or 'no faults'} | "
    spec = TASKS.get(family.task)
    if spec is not None and spec.kind == "allreduce":
        return (f"{family.task} | all-reduce sweep | {family.hardware} | {network}"
                "compared by message size")
    metric = ("speedup of time to goal" if family.metric == TIME_TO_ACCURACY
              else "no goal: speedup of throughput")
    metric_goal = task_metric(family.task).describe_goal(family.goal) if family.goal is not None else None
    goal = f"goal {metric_goal}" if metric_goal else "synthetic data"
    model = f"model {family.model} | " if family.model else ""
    framework = f"{family.framework} | " if family.framework != "pytorch" else ""
    return (f"{family.task} | {framework}{family.division} division | {family.optimizer} | {model}"
            f"{family.hardware} | {network}{goal} | {metric}")


def _score_cell(stats: RepeatStats, score: str) -> str:
    if score != MLPERF:
        return _seconds(stats.median)
    value = stats.mlperf_score
    return _seconds(value) if value is not None else f"- ({stats.runs} of 5 runs)"


def compare_row(g: Group, emulated: bool = False, faults: bool = False, score: str = MEDIAN) -> list[str]:
    """One worker count of a family, in the columns of :func:`compare_headers` (``score``: the
    repeats' median, or MLPerf's score of them)."""
    network = [g.family.network or "-"] if emulated else []
    metric = g.metric or task_metric(g.family.task)
    if any(run.sweep is not None for run in g.runs):
        return [str(g.workers), *network, str(len(g.runs)), metric.cell(g.final_accuracy),
                LATENCY.format(sweep_latency(g))]
    tta = g.time_to_accuracy
    goal = g.family.metric == TIME_TO_ACCURACY
    share = g.communication_share
    cost = "-" if g.cost is None or not goal else _usd(g.cost.median)
    return [
        g.workers_text,
        *network,
        f"{tta.converged}/{tta.runs}" if goal else f"-/{tta.runs}",
        _score_cell(tta, score) if goal else "-",
        f"{_seconds(tta.minimum)}..{_seconds(tta.maximum)}" if goal and tta.converged else "-",
        f"{_seconds(interval[0])}..{_seconds(interval[1])}" if goal and (interval := tta.interval95) else "-",
        f"{g.speedup:.2f}x" if g.speedup is not None else "-",
        f"{100 * g.efficiency:.0f}%" if g.efficiency is not None else "-",
        f"{100 * (1 - share):.0f}% / {100 * share:.0f}%" if share is not None else "-",
        f"{g.throughput.median:.0f}",
        format_bytes(g.peak_memory_bytes),
        format_fraction(g.utilisation),
        metric.cell(g.final_accuracy),
        cost,
        *(_fault_cells(g) if faults else []),
    ]


def _fault_cells(g: Group) -> list[str]:
    """GOODPUT, RESTARTS, STEPS LOST of one group (medians of its runs)."""
    goodput = f"{100 * g.goodput:.1f}%" if g.goodput is not None else "-"
    return [goodput, *("-" if v is None else f"{v:g}" for v in (g.restarts, g.lost_steps))]


def group_label(g: Group, emulated: bool = False) -> str:
    """A worker count (and its network) in a sweep table's heading or a figure's legend."""
    label = f"{g.workers} worker{'s' if g.workers > 1 else ''}"
    return f"{label}, {g.family.network or 'not emulated'}" if emulated else label


def sweep_table(comparison: Comparison) -> tuple[list[str], list[list[str]]]:
    """Task 0a's runs side by side by message size: dtype, elements, bytes, then each worker
    count's (and network's) bandwidth, the median of its repeats, formatted by the metric."""
    emulated = differs_in_network(comparison)
    groups = comparison.groups
    columns = [sweep_bandwidth(g) for g in groups]
    sizes: dict[tuple[str, int], int] = {}
    for g in groups:
        for run in g.runs:
            for row in run.sweep.rows if run.sweep else []:
                sizes.setdefault((row["dtype"], int(row["elements"])), int(row["bytes"]))
    metrics = [g.metric or task_metric(g.family.task) for g in groups]
    headers = ["DTYPE", "ELEMENTS", "BYTES",
               *[f"{group_label(g, emulated)} ({m.title}, {m.unit})" for g, m in zip(groups, metrics)]]
    rows = [[dtype, str(elements), str(size),
             *[m.format(column.get((dtype, elements))) for column, m in zip(columns, metrics)]]
            for (dtype, elements), size in sizes.items()]
    return headers, rows


def bandwidth_matrix(comparison: Comparison) -> tuple[list[str], list[list[str]]] | None:
    """Time to the goal at each emulated bandwidth, a row per optimizer (and whatever else tells
    the families apart besides the network) and worker count, with the bytes each worker sent
    per step: the table of `mlbench run ... --optimizer A,B --bandwidth R1,R2`. None unless the
    runs were made at two or more bandwidths."""
    groups = [g for g in comparison.groups if g.family.network and g.family.bandwidth_bps]
    rates = sorted({float(g.family.bandwidth_bps or 0) for g in groups})
    if len(rates) < 2 or comparison.groups[0].family.metric != TIME_TO_ACCURACY:
        return None
    lines: dict[tuple, dict[float, Group]] = {}
    for g in groups:
        rest = tuple(item for item in g.family.fingerprint if item[0] != "network")
        lines.setdefault((rest, g.workers), {})[float(g.family.bandwidth_bps or 0)] = g
    fingerprints = [dict(f.fingerprint) for f in comparison.families()]
    told_apart = [key for key, _ in comparison.differences() if key not in NAMED_KEYS and key != "network"
                  and not follows_optimizer(key, fingerprints)]   # what else a row's label must say
    headers = ["OPTIMIZER", "WORKERS", *(f"TIME TO GOAL {format_rate(r)}" for r in rates), "BYTES/STEP"]
    rows = []
    for (rest, workers), by_rate in lines.items():
        some = next(iter(by_rate.values()))
        options = " ".join(f"{key}={value}" for key, value in rest if key in told_apart)
        cells = [(_seconds(by_rate[r].time_to_accuracy.median) if by_rate[r].time_to_accuracy.converged
                  else "missed") if r in by_rate else "-" for r in rates]
        per_step = [v for g in by_rate.values() if (v := g.bytes_per_step) is not None]
        rows.append([f"{some.family.optimizer} {options}".strip(), str(workers), *cells,
                     format_bytes(median(per_step)) if per_step else "-"])
    return headers, rows


def compare_notes(comparison: Comparison) -> list[str]:
    """The sentences under the table: what the columns measure, the price, what was left out."""
    if is_sweep(comparison):
        notes = [("Bandwidth: nccl-tests' bus bandwidth (algorithm bandwidth on one worker), peak over "
                  "message sizes and types; latency: time of one all-reduce of the smallest message; "
                  "medians over the repeats.")]
        return notes + _skipped(comparison)
    if comparison.score == MLPERF:
        measure = ("MLPerf's score of the repeats: from at least 5 runs, the mean without the fastest and the "
                   "slowest (one that missed the goal may be dropped as the slowest; two make no score)")
    else:
        measure = "median over the repeats"
    notes = [(f"Time to goal: training time to the goal, evaluation excluded; {measure}; min..max over "
              "the repeats (a run that missed the goal counts as the slowest); 95% CI: Student's t interval "
              "of the mean, from 5 converged repeats.")]
    if had_faults(comparison):
        notes.append("Goodput: training time / wall time, as `status RUN` says it (docs/faults.md); restarts "
                     "and steps lost (done after the checkpoint a restart went back to, and done again) per "
                     "run; medians over the repeats.")
        for g in comparison.groups:
            totals = g.fault_totals
            if totals is not None and totals["runs"] > 1:
                notes.append(f"{g.workers_text} worker(s), {g.family.faults or 'no faults'}, summed over its "
                             f"{totals['runs']} repeats: {totals_text(totals)}.")
    if comparison.usd_per_node_hour is None:
        notes.append("Cost: local runs cost nothing unless priced (--price-per-hour USD or --instance NAME).")
    else:
        notes.append(f"Cost: node-seconds to the goal (evaluation included) at "
                     f"${comparison.usd_per_node_hour:.4g} per node-hour.")
    return notes + fairness_notes(comparison) + _skipped(comparison)


def totals_text(totals: dict[str, Any]) -> str:
    """What faults cost several repeats together (:func:`mlbench.results.goodput.summed_over_repeats`)."""
    goodput = f"goodput {100 * totals['goodput']:.1f}%" if totals["goodput"] is not None else "no goodput"
    parts = [f"{name} {totals[key]:.1f} s" for name, key in (("checkpoints", "checkpoint_s"), ("stalls", "stalled_s"),
                                                             ("link down", "link_down_s"), ("recovery", "recovery_s"))
             if totals[key]]
    return (f"{goodput} ({totals['productive_s']:.1f} s productive of {totals['wall_s']:.1f} s wall"
            f"{'; ' + ', '.join(parts) if parts else ''}), {totals['restarts']} restarts, "
            f"{totals['redone_steps']} steps redone")


def _skipped(comparison: Comparison) -> list[str]:
    if not comparison.skipped:
        return []
    listed = ", ".join(f"{r.id} ({r.state})" for r in comparison.skipped)
    return [f"Left out {len(comparison.skipped)} run(s) that did not finish: {listed}."]


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

    For an active run, and one that ended without a result (cancelled, failed), the summary of
    its events so far (``summary``, else read here) gives the epoch and the last value of the
    goal metric; an ended run has them in its result.
    """
    summary = run_summary(record, summary)
    metric, value, result = headline(record, summary)
    epoch = result.epochs if has_final_result(result, record) else epoch_so_far(record, summary)
    reached = result.reached if result and result.goal is not None else None
    model = _model_plugin_label(record)
    division = run_division(record)
    document = RunDocument.load_or_none(record.run_dir)
    return {
        "id": record.id, "name": record.name, "task": record.task, "workers": record.workers,
        "workers_text": run_workers_label(record),
        "state": record.state, "reason": record.reason, "restarts": run_restarts(record),
        "division": division.name,
        "optimizer": record.optimizer, "model": model,
        "framework": document.config.framework if document is not None else "pytorch",
        # the emulated network's label (``10 Mbit/s, 5 ms``), None where it was not shaped
        "network": (network_label(document.extra.get("network")) or None) if document is not None else None,
        "division_text": division.text, "open_reasons": list(division.reasons),
        "launcher": record.launcher, "seed": record.seed, "group_id": record.group_id, "created_at": record.created_at,
        "started_at": record.started_at, "finished_at": record.finished_at,
        "epoch": epoch, "metric": metric.name, "metric_value": value,
        "metric_title": metric.title, "metric_unit": metric.describe()["unit"],
        "metric_text": metric.cell(value),
        "goal": result.goal if result else None, "goal_reached": reached,
        "time_to_accuracy": result.time_to_accuracy if result and reached else None,
    }


def no_time_to_goal(state: str, goal: float | None) -> str:
    """Why a run has no time to the goal, as `status` and the dashboard's runs table say it:
    ``not reached`` (it ended without reaching it), ``no goal`` (synthetic data, task 0a), ``-``
    (still running)."""
    if state in ACTIVE_STATES:
        return "-"
    return "no goal" if goal is None else "not reached"


def framework_of(record: RunRecord) -> str:
    """The framework that trained the run (run.json; the catalog has no column for it): runs
    recorded before there was a choice, or whose run.json is gone, were PyTorch's."""
    document = RunDocument.load_or_none(record.run_dir)
    return document.config.framework if document is not None else "pytorch"


def phases_not_measured(record: RunRecord, summary: RunSummary) -> str | None:
    """Why a run that has trained shows no time per phase, in one sentence; None when it has
    phase times (or has not trained yet). The one text of `status RUN`, its JSON and the
    dashboard's run page, so that no surface shows a table of zeros."""
    if not summary.ranks or not summary.steps or any(any(t.values()) for t in summary.phase_seconds.values()):
        return None
    document = RunDocument.load_or_none(record.run_dir)
    framework = document.config.framework if document is not None else "pytorch"
    if framework != DEFAULT_FRAMEWORK:
        return (f"not measured: a {get_framework(framework).title} step is one compiled program, whose "
                "all-reduce cannot be timed apart (the step time is the wall clock's)")
    if document is not None and not document.config.timing:
        return "not measured: the run was started with --no-timing"
    return "not measured: the workers recorded no phase times"


def _model_plugin_label(record: RunRecord) -> str | None:
    """``NAME@SHA12`` of the run's model plug-in (as ``optimizer`` names an optimizer plug-in),
    None for the task's own model. Only an open-division run can have one, so only its run.json
    is read (the catalog has the optimizer, not the model)."""
    if record.division != "open":
        return None
    return model_plugin_label(run_plugins(record).get("model"))


def model_plugin_label(plugin: dict[str, Any] | None) -> str | None:
    """``NAME@SHA12`` of run.json's record of a model plug-in; None without one."""
    return plugin_label(str(plugin.get("name")), str(plugin.get("sha256"))) if plugin else None


def run_plugin(record: RunRecord) -> dict[str, Any] | None:
    """run.json's record of the run's plug-in optimizer (name, spec, class, the copy's file and
    full SHA-256, options), or None for a built-in."""
    return run_plugins(record).get("optimizer")


def run_plugins(record: RunRecord) -> dict[str, dict[str, Any]]:
    """run.json's records of the run's plug-ins by kind (``optimizer``, ``model``); only those it has."""
    document = RunDocument.load_or_none(record.run_dir)
    if document is None:
        return {}
    found = {"optimizer": document.config.optimizer_plugin, "model": document.config.model_plugin}
    return {kind: plugin for kind, plugin in found.items() if plugin}


def describe_plugin(plugin: dict[str, Any] | None) -> str | None:
    """``my-sgd, sha256 1a2b3c4d5e6f (./my_sgd.py:MySGD, kept as plugin/my_sgd/my_sgd.py)``, or
    ``kept in plugin/two/ with 4 files`` for a plug-in of several files: which code ran (the hash
    names the files the workers executed), or None for a built-in; for a plug-in of either kind
    (optimizer, model)."""
    if not plugin:
        return None
    sha = str(plugin.get("sha256") or "")
    files = plugin.get("files") or {}
    kept = f"kept in {plugin.get('folder')}/ with {len(files)} files" if len(files) > 1 \
        else f"kept as {plugin.get('file')}"
    return f"{plugin.get('name')}, sha256 {sha[:SHORT_HASH]} ({plugin.get('spec')}, {kept})"


#: The keys of :func:`run_overview`, in its order: what `status --sort` orders by.
OVERVIEW_FIELDS = ("id", "name", "task", "workers", "workers_text", "state", "reason", "restarts", "division",
                   "optimizer", "model", "framework", "network", "division_text", "open_reasons", "launcher", "seed",
                   "group_id", "created_at", "started_at", "finished_at", "epoch", "metric",
                   "metric_value", "metric_title", "metric_unit", "metric_text", "goal", "goal_reached",
                   "time_to_accuracy")


def parse_sort(text: str) -> tuple[str, bool]:
    """``FIELD`` (ascending) or ``-FIELD`` (descending) -> (field, descending); a field that is
    not an overview key is a usage error that lists them."""
    field = text.strip().removeprefix("-")
    if field not in OVERVIEW_FIELDS:
        raise UsageError(f"--sort {text}: not a field of a run; choose from {', '.join(OVERVIEW_FIELDS)} "
                         "(-FIELD for descending)")
    return field, text.strip().startswith("-")


def sort_runs(runs: list[dict[str, Any]], field: str, descending: bool = False) -> list[dict[str, Any]]:
    """Overview rows ordered by ``field``; runs without a value come last either way, and runs
    with equal values newest first, so that a script's ``runs[0]`` is always the same run."""
    newest = sorted(runs, key=lambda r: r["created_at"] or 0, reverse=True)
    # sorted() is stable with reverse=True too: ties stay newest first
    known = sorted((r for r in newest if r[field] is not None), key=lambda r: r[field], reverse=descending)
    return known + [r for r in newest if r[field] is None]


def run_recovery(record: RunRecord) -> dict[str, Any]:
    """A run's checkpoints and resumes, as `status RUN` (table and ``-o json``) and the
    dashboard's run page show them: ``checkpoints`` (None for a run without checkpoints:
    ``every`` as given, the newest complete one's step, how many are kept, their folder) and
    ``resumes`` (from which step, when, after what)."""
    document = RunDocument.load_or_none(record.run_dir)
    if document is None:
        return {"checkpoints": None, "resumes": []}
    config = document.config
    checkpoints = None
    if config.checkpoints:
        if config.checkpoint_every_steps is not None:
            every = f"{config.checkpoint_every_steps} steps"
        elif config.checkpoint_auto_mtbf_s is not None:
            every = auto_interval_text(record, config.checkpoint_auto_mtbf_s)
        else:
            every = fmt_duration(config.checkpoint_every_s)
        root = checkpoint_root(record.run_dir, config.checkpoint_dir)
        checkpoints = {"every": every, **checkpoint_summary(record.run_dir, root, config.workers)}
    return {"checkpoints": checkpoints, "resumes": [dict(r) for r in document.resumes]}


def auto_interval_text(record: RunRecord, mtbf_s: float) -> str:
    """``--checkpoint-every auto``'s interval as the workers chose it last (rank 0's latest
    ``checkpoint/interval`` event), with what it was made from."""
    from mlbench.results.events import events_path, read_rank_events

    chosen = [e["value"] for e in read_rank_events(events_path(record.run_dir, 0))
              if e["name"] == "checkpoint/interval" and isinstance(e.get("value"), dict)]
    if not chosen:
        return f"auto (Young/Daly with an MTBF of {fmt_duration(mtbf_s)}; no checkpoint measured yet)"
    last = chosen[-1]
    return (f"{fmt_duration(last['seconds'])} (auto: Daly's optimum for a checkpoint cost of "
            f"{1000 * last['cost_s']:.1f} ms and an MTBF of {fmt_duration(mtbf_s)})")


def describe_checkpoints(checkpoints: dict[str, Any] | None) -> str | None:
    """``every 100 steps; newest at step 300 (2 kept)``, or None for a run without them."""
    if checkpoints is None:
        return None
    newest = (f"newest at step {checkpoints['newest_step']} ({checkpoints['count']} kept)"
              if checkpoints["newest_step"] is not None else "none written yet")
    return f"every {checkpoints['every']}; {newest}"


def describe_resumes(resumes: list[dict[str, Any]]) -> str | None:
    """``2: from step 3 (after cancelled), from step 6 (after failed)``, or None when never resumed."""
    if not resumes:
        return None
    return f"{len(resumes)}: " + ", ".join(f"from step {r.get('from_step')} (after {r.get('after')})"
                                          for r in resumes)


def run_details(record: RunRecord, summary: RunSummary,
                events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One run as `mlbench status RUN` shows it: the overview, the summary of its metric events
    over all workers (``events``: those events, when the caller has read them), its result as
    recorded and the result sentence."""
    phases = {phase: {"mean": mean, "max": top, "share": share}
              for phase, mean, top, share in phase_table(summary)} if summary.ranks else {}
    evals = list(summary.eval_seconds.values())
    sent = list(summary.bytes_sent.values())
    result = read_result(record.result)
    plugins = run_plugins(record)
    sweep = ({"latency_us": result.latency_us, "rows": result.rows}
             if isinstance(result, AllreduceResult) else None)
    return {
        **run_overview(record, summary),
        "summary": {
            "steps": summary.steps, "epoch": summary.epoch, "train_time": summary.train_time,
            "samples": summary.samples, "throughput": summary.throughput,
            "throughput_unit": throughput_unit(record.task),
            "last_train_loss": summary.last_train_loss, "last_lr": summary.last_lr,
            "evaluations": [dict(e) for e in summary.evaluations],
            "phases": phases, "phases_note": phases_not_measured(record, summary),
            "evaluation_seconds": ({"mean": sum(evals) / len(evals), "max": max(evals)}
                                   if evals else None),
            "communication_ratio": summary.communication_ratio,
            "bytes_sent_per_worker": sum(sent) / len(sent) if sent else None,
            "compression_ratio": summary.compression_ratio,
            "errors": list(summary.errors),
        },
        "system": system.to_dict() if (system := system_metrics(summary)) is not None else None,
        "optimizer_plugin": plugins.get("optimizer"),
        "model_plugin": plugins.get("model"),
        "result": record.result,
        "result_sentence": result.sentence() if result else None,
        **run_recovery(record),
        "faults": run_faults(record, summary),
        "timeline": run_timeline(record, events=events).to_dict(),
        **({"allreduce": sweep} if sweep else {}),
    }


def _stats(stats: RepeatStats) -> dict[str, Any]:
    interval = stats.interval95
    return {"n": stats.runs, "median": finite(stats.median), "min": finite(stats.minimum),
            "max": finite(stats.maximum), "olympic_mean": finite(stats.olympic_mean),
            "interval95": list(interval) if interval else None, "mlperf_score": stats.mlperf_score,
            "mlperf_note": stats.mlperf_note}


def _group(group: Group) -> dict[str, Any]:
    goal = group.family.metric == TIME_TO_ACCURACY
    tta = group.time_to_accuracy
    return {
        "workers": group.workers, "workers_text": group.workers_text, "runs": tta.runs,
        "run_ids": [r.record.id for r in group.runs],
        "flags": group_flags(group),
        "converged": tta.converged if goal else None,
        "time_to_accuracy": _stats(tta) if goal else None,
        "speedup": group.speedup,
        "speedup_range": list(group.speedup_range) if group.speedup_range else None,
        "efficiency": group.efficiency,
        "bytes_per_step": group.bytes_per_step,
        "compute_seconds": group.compute_seconds,
        "communication_seconds": group.communication_seconds,
        "communication_share": group.communication_share,
        "throughput": _stats(group.throughput),
        "final_accuracy": group.final_accuracy,
        "metric": (group.metric or task_metric(group.family.task)).name,
        "metric_value": group.final_accuracy,
        "cost_to_accuracy": _stats(group.cost) if goal and group.cost is not None else None,
        "peak_memory_bytes": group.peak_memory_bytes,
        "utilisation": group.utilisation,
        "goodput": group.goodput, "restarts": group.restarts, "lost_steps": group.lost_steps,
        "fault_totals": group.fault_totals,
        **({"latency_us": sweep_latency(group),
            "sweep": [{"dtype": dtype, "elements": elements, "bandwidth_gbps": value}
                      for (dtype, elements), value in sweep_bandwidth(group).items()]}
           if any(run.sweep is not None for run in group.runs) else {}),
    }


def comparison_document(comparison: Comparison) -> dict[str, Any]:
    """`mlbench compare` as data: per family (runs that may be compared), one entry per worker
    count with the statistics over its repeats."""
    return {
        "task": comparison.task,
        "throughput_unit": throughput_unit(comparison.task),
        "usd_per_node_hour": comparison.usd_per_node_hour,
        "score": comparison.score,
        "differences": [{"key": key, "values": values} for key, values in comparison.differences()],
        "pooled": list(comparison.pooled),
        "families": [{
            "task": family.task, "framework": family.framework, "division": family.division,
            "optimizer": family.optimizer, "hardware": family.hardware, "network": family.network, "goal": family.goal,
            "faults": family.faults or None, "measure": family.metric,
            "fingerprint": dict(family.fingerprint),
            "groups": [_group(g) for g in groups],
        } for family, groups in comparison.families().items()],
        "skipped": [{"id": r.id, "state": r.state} for r in comparison.skipped],
    }

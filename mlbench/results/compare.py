"""`mlbench compare`: runs side by side, grouped so that only like is compared with like.

Runs are grouped by *family*: their division and their fingerprint
(:mod:`mlbench.results.fingerprint`: every setting that changes what a run computes, from the
task's settings and the optimizer's options to the data's identity, the stop rule, the threads per
worker, the network and the faults), less the worker count; within a family, by worker count.
Repeats of one configuration fall into one group and are summarised with
:mod:`mlbench.results.repeats`. Within a family, speedup is relative to the smallest worker count
present (the original's figures: "speedup relative to one node") and parallel efficiency is the
speedup divided by the growth in workers. Runs that differ in anything they compute never share a
family, unless a key is pooled on purpose (``--pool``): a speedup across them would compare two
things at once. :meth:`Comparison.differences` says what tells the families shown apart. Runs
with faults add their goodput, restarts and lost steps (medians over the repeats, from
:mod:`mlbench.results.goodput`, as `status RUN` says them).

The measure behind the speedup is time to accuracy (docs/tasks.md); a family without a goal (synthetic
data, for throughput only) is compared by training throughput instead, and says so. The compute /
communication split adds up the phase times of every worker of every run in the group, not rank 0
alone (docs/tasks.md, "What is timed").
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from statistics import median
from typing import Any, TypedDict

from mlbench.errors import UsageError
from mlbench.plugins import plugin_label
from mlbench.results.cost import cost_usd, node_hour_price
from mlbench.network.settings import network_label
from mlbench.results.division import run_division
from mlbench.results.events import read_run_events
from mlbench.results.fingerprint import differing_keys, pool_matches, run_fingerprint
from mlbench.results.goodput import fault_setting, had_faults, run_faults, summed_over_repeats
from mlbench.results.repeats import RepeatStats, repeat_stats
from mlbench.results.outcome import AllreduceResult, Outcome, TrainingResult, read_result
from mlbench.results.store import FINISHED, RunRecord, RunStore
from mlbench.results.summary import RunSummary, StepGaps, summarize
from mlbench.results.sysmetrics import system_metrics
from mlbench.run_config import Occupancy, RunConfig, RunDocument, occupancy
from mlbench.tasks.metrics import Metric
from mlbench.tasks.registry import get_task

TIME_TO_ACCURACY, THROUGHPUT = "time to accuracy", "throughput"
#: ``compare --score``: a row's time to accuracy is the median of its repeats, or MLPerf's score
#: of them (:attr:`mlbench.results.repeats.RepeatStats.mlperf_score`)
MEDIAN, MLPERF = "median", "mlperf"
SCORES = (MEDIAN, MLPERF)


def hardware_label(device: str | None, environment: dict[str, Any]) -> str:
    """What a worker ran on (``device``: cpu or cuda), coarse enough that repeats on one machine
    type share it."""
    gpus = environment.get("gpus") or []
    if device == "cuda" and gpus:
        return str(gpus[0])
    cpu = str(environment.get("cpu") or "CPU")
    cores = environment.get("cores")
    return f"{cpu} ({cores} cores)" if cores else cpu


class TrainingPoint(TypedDict):
    """One logging interval of :func:`training_curve`."""

    time: float
    epoch: float
    step: int
    loss: float
    throughput: float | None  # None when the interval took no time
    bytes: int


def training_curve(events: list[dict[str, Any]], workers: int = 1) -> list[TrainingPoint]:
    """Rank 0's logging intervals: training seconds, epoch, step, training loss, samples/s over
    all workers in the interval (rank 0's x workers: the steps are synchronous) and the bytes
    rank 0 has sent so far."""
    points: list[TrainingPoint] = []
    pending: tuple[int, float] | None = None
    samples, sent, last_time = 0, 0, 0.0
    gaps = StepGaps()
    for e in events:
        if e.get("rank", 0) != 0:
            continue
        if e["name"] == "train/loss":
            pending = (int(e["step"]), float(e["value"]))
        elif e["name"] == "train/steps":
            gaps.steps(0, int(e["step"]), int(e["value"]))
        elif e["name"] == "train/samples":
            samples += gaps.samples(0, int(e["step"]), int(e["value"]))
        elif e["name"] == "comm/bytes":  # written after the interval's train/time
            sent += int(e["value"])
            if points and points[-1]["step"] == int(e["step"]):
                points[-1]["bytes"] = sent
        elif e["name"] == "train/time" and pending and pending[0] == int(e["step"]):
            now = float(e["value"])
            rate = samples * workers / (now - last_time) if now > last_time else None
            points.append({"time": now, "epoch": float(e["epoch"]), "step": pending[0],
                           "loss": pending[1], "throughput": rate, "bytes": sent})
            pending, samples, last_time = None, 0, now
    return points


def loss_curve(events: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(training seconds, training loss) of rank 0, one point per logging interval."""
    return [(p["time"], p["loss"]) for p in training_curve(events)]


@dataclass
class RunResult:
    """One finished run as compare and charts see it."""

    record: RunRecord
    summary: RunSummary
    config: RunConfig | None
    hardware: str
    losses: list[tuple[float, float]] = field(default_factory=list)
    network: dict[str, Any] | None = None   # run.json's emulated network, None: as it was
    #: :func:`mlbench.results.goodput.run_faults`: the faults, restarts and goodput, as `status` says
    faults: dict[str, Any] = field(default_factory=dict)
    #: its run.json (None: unreadable) and its fingerprint (:mod:`mlbench.results.fingerprint`)
    document: RunDocument | None = None
    fingerprint: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, record: RunRecord) -> RunResult:
        events = read_run_events(record.run_dir)
        summary = summarize(events)
        document = RunDocument.load_or_none(record.run_dir)
        config = document.config if document else None
        environment = summary.environment or (document.environment if document else {})
        hardware = hardware_label(config.device if config else None, environment)
        faults = run_faults(record, summary, events)
        fingerprint = run_fingerprint(document, hardware, fault_setting(faults)) if document is not None else {}
        return cls(record, summary, config, hardware, loss_curve(events),
                   document.extra.get("network") if document else None, faults, document, fingerprint)

    @property
    def had_faults(self) -> bool:
        """Whether faults were injected into the run or it restarted after a failure."""
        return had_faults(self.faults)

    @property
    def outcome(self) -> Outcome | None:
        """The run's result of its kind (training or task 0a's sweep)."""
        return read_result(self.record.result or self.summary.result)

    @property
    def result(self) -> TrainingResult:
        """The training result; an empty one (no goal) for a run of another kind."""
        outcome = self.outcome
        return outcome if isinstance(outcome, TrainingResult) else TrainingResult()

    @property
    def sweep(self) -> AllreduceResult | None:
        """Task 0a's sweep; None for a training run."""
        outcome = self.outcome
        return outcome if isinstance(outcome, AllreduceResult) else None

    @property
    def goal(self) -> float | None:
        return self.result.goal

    @property
    def model_plugin(self) -> str:
        """The run's model plug-in as ``name@sha`` (its spec's model), or "" for the task's own:
        two sources never share a row."""
        plugin = self.config.model_plugin if self.config is not None else None
        return plugin_label(str(plugin["name"]), str(plugin["sha256"])) if plugin else ""

    @property
    def time_to_accuracy(self) -> float | None:
        """Training seconds to the goal (evaluation excluded), None when it was not reached."""
        return self.result.time_to_accuracy if self.result.reached else None

    @property
    def wall_time_to_accuracy(self) -> float | None:
        """Seconds to the goal with evaluation: what the machines were paid for."""
        return self.result.wall_time_to_accuracy if self.result.reached else None

    @property
    def occupancy(self) -> Occupancy:
        """The machines the run occupied, as its launcher recorded them in run.json."""
        return occupancy(self.record.run_dir, self.record.launcher, self.record.workers)

    @property
    def nodes(self) -> int:
        """Machines the run occupied (one for a run on this machine or torchrun on one node)."""
        return self.occupancy.nodes

    def phase_totals(self) -> tuple[float, float]:
        """(compute, communication) seconds summed over every worker."""
        ranks = self.summary.ranks
        return (sum(self.summary.compute_seconds(r) for r in ranks),
                sum(self.summary.communication_seconds(r) for r in ranks))


@dataclass(frozen=True)
class Family:
    """Runs that may be compared with each other across worker counts."""

    task: str
    division: str
    optimizer: str
    hardware: str
    goal: float | None
    network: str = ""                  # the emulated network's label; "" when not emulated
    bandwidth_bps: float | None = None
    latency_s: float = 0.0             # the emulated network's one-way latency
    model: str = ""                    # a model plug-in's name@sha; "": the task's own model
    framework: str = "pytorch"         # mlbench.frameworks: which framework trained
    #: the --inject schedules and --on-failure policy (goodput.fault_setting); "": neither
    faults: str = ""
    #: the runs' fingerprint (mlbench.results.fingerprint) less what ``--pool`` pooled, as
    #: sorted (key, text) pairs: every setting that changes what they compute is equal
    fingerprint: tuple[tuple[str, str], ...] = ()

    def setting(self, key: str) -> str:
        """The text of fingerprint ``key`` in this family ("-" when it has none)."""
        return dict(self.fingerprint).get(key, "-")

    def has_setting(self, key: str) -> bool:
        """Whether ``key`` is worth saying of this family: anything but another optimizer's
        option, which this family's optimizer does not have."""
        return not (key.startswith("opt.") and self.setting(key) == "-")

    @property
    def metric(self) -> str:
        return TIME_TO_ACCURACY if self.goal is not None else THROUGHPUT


@dataclass
class Group:
    """The runs of one family with one worker count (repeats of one configuration)."""

    family: Family
    workers: int
    runs: list[RunResult]
    time_to_accuracy: RepeatStats
    throughput: RepeatStats            # samples/s over all workers (higher is better)
    final_accuracy: float | None       # median of the runs' headline value (goal metric, 0a's peak)
    compute_seconds: float             # over all workers of all runs
    communication_seconds: float
    cost: RepeatStats | None           # USD to accuracy per run; None: no price for these runs
    metric: Metric | None = None       # what final_accuracy measures (the runs' headline metric)
    speedup: float | None = None
    speedup_range: tuple[float, float] | None = None
    efficiency: float | None = None
    #: medians over the runs of their systems metrics (mlbench.results.sysmetrics); None when
    #: no run recorded them
    peak_memory_bytes: float | None = None   # the largest rank's CUDA peak on a GPU, else its RSS peak
    utilisation: float | None = None         # achieved FLOP/s over the devices' peak
    #: medians over the runs of what faults cost them (mlbench.results.goodput); None: no run
    #: said (goodput needs a run that trained)
    goodput: float | None = None             # productive training time / wall time
    restarts: float | None = None            # restarts of the group per run
    lost_steps: float | None = None          # steps done after a restart's checkpoint, done again
    #: the same summed over the runs (goodput.summed_over_repeats): wall, checkpoint, stalled,
    #: link-down and recovery seconds, redone steps, restarts; None: no run trained
    fault_totals: dict[str, Any] | None = None

    @property
    def workers_text(self) -> str:
        """The worker count, with where ``--on-failure shrink`` left the runs that shrank:
        ``4``, ``4 -> 3``, ``4 -> 2..3`` (repeats that shrank differently)."""
        ends = sorted({sizes[-1] for run in self.runs if len(sizes := run.faults.get("workers") or []) > 1})
        if not ends:
            return str(self.workers)
        if any(len(run.faults.get("workers") or []) <= 1 for run in self.runs):
            ends = sorted({*ends, self.workers})
        return f"{self.workers} -> {ends[0]}" + (f"..{ends[-1]}" if len(ends) > 1 else "")

    @property
    def had_faults(self) -> bool:
        """Whether any run of the group was put through faults or restarted."""
        return any(run.had_faults for run in self.runs)

    @property
    def communication_share(self) -> float | None:
        total = self.compute_seconds + self.communication_seconds
        return self.communication_seconds / total if total > 0 else None

    @property
    def bytes_per_step(self) -> float | None:
        """What rank 0 sent per training step, the median of the repeats (None: no step)."""
        return _median([run.summary.bytes_sent.get(0, 0) / run.summary.steps
                        for run in self.runs if run.summary.steps])


@dataclass
class Comparison:
    task: str
    groups: list[Group]
    skipped: list[RunRecord]
    usd_per_node_hour: float | None
    #: the fingerprint keys pooled on purpose (``compare --pool KEY``): runs that differ in them
    #: share a family, and every heading says so
    pooled: tuple[str, ...] = ()
    #: what a row's time to accuracy is (``compare --score``): the repeats' median, or MLPerf's score
    score: str = MEDIAN

    def families(self) -> dict[Family, list[Group]]:
        out: dict[Family, list[Group]] = defaultdict(list)
        for g in self.groups:
            out[g.family].append(g)
        return dict(out)

    def differences(self) -> list[tuple[str, list[str]]]:
        """What differs between the families shown: each fingerprint key whose text is not the
        same in all of them, with its text per family (in the order of :meth:`families`)."""
        families = list(self.families())
        keys = differing_keys([dict(f.fingerprint) for f in families])
        return [(key, [f.setting(key) for f in families]) for key in keys]


def select_runs(store: RunStore, refs: tuple[str, ...] = (), task: str | None = None,
                group: str | None = None) -> list[RunRecord]:
    """The runs named by id/name, or all runs of a task and/or of one `mlbench run` invocation."""
    if refs and (task or group):
        raise UsageError("give run ids, or --task/--group, not both")
    if refs:
        return [store.get(ref) for ref in refs]
    if not task and not group:
        raise UsageError("say which runs: give run ids, --task TASK or --group GROUP")
    if task:
        get_task(task)
    records = [r for r in store.list()
               if (task is None or r.task == task) and (group is None or r.group_id == group)]
    if not records:
        what = " and ".join(x for x in (task and f"task {task}", group and f"group {group}") if x)
        raise UsageError(f"no runs of {what} yet; `mlbench status` lists the runs")
    return records


def comparison_of(store: RunStore, refs: tuple[str, ...] = (), task: str | None = None,
                  group: str | None = None, instance: str | None = None,
                  price_per_hour: float | None = None, prices_file: str | None = None,
                  pool: tuple[str, ...] = (), score: str = MEDIAN) -> Comparison:
    """The comparison `compare` and `charts` show: runs chosen as :func:`select_runs` chooses
    them, priced by an instance type of the price table or a price per node-hour, pooled across
    the fingerprint keys ``pool`` names, each row's time scored by ``score``."""
    usd = node_hour_price(instance, price_per_hour, prices_file)
    return compare_runs(select_runs(store, tuple(refs), task, group), usd, pool, score)


#: Family fields that a fingerprint key stands for: pooling the key pools the field too.
_POOLED_FIELDS = {"optimizer": ("optimizer",), "hardware": ("hardware",), "framework": ("framework",),
                  "faults": ("faults",), "network": ("network", "bandwidth_bps", "latency_s"),
                  "model.sha256": ("model",)}


def _family(record: RunRecord, run: RunResult, pool: tuple[str, ...]) -> Family:
    faults = fault_setting(run.faults)
    fields: dict[str, Any] = dict(
        task=record.task, division=run_division(record, run.document).name, optimizer=record.optimizer,
        hardware=run.hardware, goal=run.goal, network=network_label(run.network),
        bandwidth_bps=(run.network or {}).get("bandwidth_bps"),
        latency_s=float((run.network or {}).get("latency_s") or 0.0), model=run.model_plugin,
        framework=run.config.framework if run.config is not None else "pytorch", faults=faults)
    for key, names in _POOLED_FIELDS.items():
        if pool_matches(key, pool):
            fields.update({name: Family.__dataclass_fields__[name].default for name in names if name != "hardware"})
            if "hardware" in names:
                fields["hardware"] = "pooled hardware"
    kept = tuple((key, text) for key, text in run.fingerprint.items() if not pool_matches(key, pool))
    return Family(**fields, fingerprint=kept)


def check_pool(pool: tuple[str, ...], known: set[str]) -> None:
    """Refuse a ``--pool`` key that no run has (a typo would pool nothing and look like it had)."""
    for key in pool:
        if not any(pool_matches(k, (key,)) for k in known):
            near = sorted(known)[:12]
            raise UsageError(f"--pool {key}: no run compared has that setting; the keys are the fingerprint's "
                             f"(`mlbench compare -o json` lists them), e.g. {', '.join(near)}")


def compare_runs(records: list[RunRecord], usd_per_node_hour: float | None = None,
                 pool: tuple[str, ...] = (), score: str = MEDIAN) -> Comparison:
    """Group finished runs and compute repeats statistics, speedup, efficiency and cost.

    ``usd_per_node_hour`` prices every run; without it a local run costs nothing (the machine is
    already paid for) and a cluster run has no known cost. Runs share a family only when their
    fingerprints are equal, less the keys ``pool`` names (pooled on purpose, and said).
    ``score``: a row's time to accuracy, and the speedup made of it, is the repeats' median or
    MLPerf's score of them (None with fewer than 5 runs).
    """
    if score not in SCORES:
        raise UsageError(f"--score {score}: choose {' or '.join(SCORES)}")
    tasks = sorted({r.task for r in records})
    if len(tasks) > 1:
        by_task = "; ".join(f"{t}: {', '.join(r.id for r in records if r.task == t)}" for t in tasks)
        raise UsageError(f"cannot compare runs of different tasks ({by_task}); compare one task at a time")
    finished = [r for r in records if r.state == FINISHED]
    if not finished:
        states = ", ".join(sorted({r.state for r in records}))
        raise UsageError(f"no finished run among the {len(records)} run(s) given ({states}); "
                         "wait for them to finish or pick others (`mlbench status`)")
    buckets: dict[tuple[Family, int], list[RunResult]] = defaultdict(list)
    loaded = [(record, RunResult.load(record)) for record in finished]
    if pool:
        check_pool(pool, {key for _, run in loaded for key in run.fingerprint})
    for record, run in loaded:
        buckets[(_family(record, run, pool), record.workers)].append(run)
    groups = [_group(f, k, runs, usd_per_node_hour)
              for (f, k), runs in sorted(buckets.items(), key=lambda item: _sort_key(*item[0]))]
    by_family: dict[Family, list[Group]] = defaultdict(list)
    for g in groups:
        by_family[g.family].append(g)
    for family_groups in by_family.values():
        _add_speedup(family_groups, score)
    return Comparison(tasks[0], groups, [r for r in records if r.state != FINISHED], usd_per_node_hour,
                      tuple(pool), score)


def _sort_key(family: Family, workers: int) -> tuple:
    return (family.framework, family.division, family.optimizer, family.model, family.hardware, family.goal or 0.0,
            family.bandwidth_bps or math.inf, family.network, family.faults, family.fingerprint, workers)


def _group(family: Family, workers: int, runs: list[RunResult], usd: float | None) -> Group:
    compute = communication = 0.0
    for run in runs:
        c, m = run.phase_totals()
        compute, communication = compute + c, communication + m
    outcomes = [run.outcome for run in runs]
    systems = [m for m in (system_metrics(run.summary) for run in runs) if m is not None]
    memory = [m.cuda_peak_bytes if m.cuda_peak_bytes is not None else m.peak_rss_bytes for m in systems]
    utilisation = [m.utilisation for m in systems if m.utilisation is not None]
    accuracies = [o.headline for o in outcomes if o is not None and o.headline is not None]
    return Group(
        family=family, workers=workers, runs=runs,
        time_to_accuracy=repeat_stats(run.time_to_accuracy for run in runs),
        throughput=RepeatStats(tuple(sorted(run.summary.throughput or 0.0 for run in runs))),
        final_accuracy=median(accuracies) if accuracies else None,
        compute_seconds=compute, communication_seconds=communication,
        cost=_costs(runs, usd), metric=next((o.goal_metric for o in outcomes if o is not None), None),
        peak_memory_bytes=_median([m for m in memory if m is not None]), utilisation=_median(utilisation),
        goodput=_median([run.faults["goodput"] for run in runs if run.faults.get("goodput") is not None]),
        restarts=_median([run.faults.get("restarts", 0) for run in runs]),
        lost_steps=_median([run.faults.get("lost_steps", 0) for run in runs]),
        fault_totals=summed_over_repeats(run.faults for run in runs) if any(run.had_faults for run in runs) else None)


def _median(values: list[float] | list[int]) -> float | None:
    return median(values) if values else None


def _costs(runs: list[RunResult], usd: float | None) -> RepeatStats | None:
    values = []
    for run in runs:
        price = usd if usd is not None else (0.0 if run.occupancy.on_this_machine else None)
        if price is None:
            return None
        wall = run.wall_time_to_accuracy
        values.append(None if wall is None else cost_usd(wall, run.nodes, price))
    return repeat_stats(values)


def _add_speedup(groups: list[Group], score: str = MEDIAN) -> None:
    """Speedup and efficiency relative to the family's smallest worker count.

    Time to accuracy: base median / median (``score`` mlperf: base MLPerf score / MLPerf score),
    with a range from the group's slowest to fastest run. Throughput: median / base median, with
    the range from the group's lowest to highest rate.
    """
    def scored(stats: RepeatStats) -> float:
        if score == MLPERF:
            value = stats.mlperf_score
            return value if value is not None else math.inf
        return stats.median

    base = min(groups, key=lambda g: g.workers)
    for g in groups:
        if g.family.metric == TIME_TO_ACCURACY:
            ref, stats = scored(base.time_to_accuracy), g.time_to_accuracy
            if not (math.isfinite(ref) and math.isfinite(scored(stats))) or stats.minimum <= 0:
                continue
            g.speedup = ref / scored(stats)
            g.speedup_range = (ref / stats.maximum, ref / stats.minimum)
        else:
            ref, stats = base.throughput.median, g.throughput
            if ref <= 0:
                continue
            g.speedup = stats.median / ref
            g.speedup_range = (stats.minimum / ref, stats.maximum / ref)
        g.efficiency = g.speedup / (g.workers / base.workers)


def sweep_bandwidth(group: Group) -> dict[tuple[str, int], float]:
    """Task 0a: per (dtype, elements) the median over the group's repeats of the headline
    bandwidth (bus bandwidth; algorithm bandwidth on one worker), in GB/s."""
    values: dict[tuple[str, int], list[float]] = defaultdict(list)
    for sweep in (run.sweep for run in group.runs):
        if sweep is None:
            continue
        for row in sweep.rows:
            values[(row["dtype"], int(row["elements"]))].append(sweep.bandwidth(row))
    return {key: median(v) for key, v in values.items()}


def sweep_latency(group: Group) -> float | None:
    """Task 0a: the median over the group's repeats of the small-message latency (us)."""
    values = [run.sweep.latency_us for run in group.runs if run.sweep and run.sweep.latency_us is not None]
    return median(values) if values else None

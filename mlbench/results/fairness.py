"""Whether the rows of a comparison are fair to compare, said beside `compare`'s tables.

A speedup means something only when each worker had the same resources whatever the worker
count (MLBench's scaling runs: one worker per node) and nothing else kept the machine busy. So
every surface of `compare` flags what it can see in the runs' records:

- **oversubscribed**: the workers of a run on one machine, times their threads, outnumber its
  usable cores, so they took turns and the run measured the machine, not the method;
- **busy**: the machine's load at the run's start or end (rank 0's environment and result,
  :func:`mlbench.results.environment.machine_was_busy`) says other work ran beside it;
- **threads differ**: a family whose runs had different threads per worker (only when pooled
  on purpose: threads per worker are part of the fingerprint);
- **superlinear**: a parallel efficiency above :data:`SUPERLINEAR` is a finding to explain, not a
  result, and is said with its likely cause;
- **indistinguishable**: two families at the same worker count whose ranges of time to goal
  (or throughput) overlap cannot be told apart at that number of repeats.
"""

from __future__ import annotations

from itertools import combinations
from typing import TYPE_CHECKING

from mlbench.results.environment import machine_was_busy
from mlbench.results.fingerprint import follows_optimizer
from mlbench.results.repeats import RepeatStats, indistinguishable

if TYPE_CHECKING:
    from mlbench.results.compare import Comparison, Family, Group, RunResult

#: The parallel efficiency above which a speedup is flagged as superlinear (110%).
SUPERLINEAR = 1.10


def threads_of(run: RunResult) -> int:
    """The threads each worker of ``run`` trained with: what rank 0 recorded using, else run.json's."""
    used = run.summary.environment.get("threads_per_worker") if run.summary.environment else None
    if isinstance(used, int) and not isinstance(used, bool) and used > 0:
        return used
    return run.config.threads_per_worker if run.config is not None else 1


def _cores(run: RunResult) -> int | None:
    environment = run.summary.environment or {}
    cores = environment.get("cores")
    return cores if isinstance(cores, int) and cores > 0 else None


def oversubscribed(run: RunResult) -> bool:
    """Whether a run on one machine had more worker threads than that machine's usable cores."""
    cores = _cores(run)
    return (cores is not None and run.nodes == 1
            and run.record.workers * threads_of(run) > cores)


def was_busy(run: RunResult) -> bool:
    """Whether the machine was busy at the run's start or end, other than with the run itself."""
    environment = run.summary.environment or {}
    cores = _cores(run)
    here = run.record.workers if run.nodes == 1 else 1   # rank 0's machine holds at least rank 0
    own = here * threads_of(run)
    result = run.record.result or {}
    moments = ((environment.get("load_average"), environment.get("runnable")),
               (result.get("load_average_end"), result.get("runnable_end")))
    return any(machine_was_busy(load if isinstance(load, list) else None, cores, own,
                                runnable if isinstance(runnable, int) and not isinstance(runnable, bool) else None)
               for load, runnable in moments)


def group_flags(group: Group) -> list[str]:
    """Short marks for one row (``oversubscribed``, ``busy 1/3``, ``threads 1/2``)."""
    flags = []
    if any(oversubscribed(run) for run in group.runs):
        flags.append("oversubscribed")
    busy = sum(1 for run in group.runs if was_busy(run))
    if busy:
        flags.append(f"busy {busy}/{len(group.runs)}")
    threads = sorted({threads_of(run) for run in group.runs})
    if len(threads) > 1:
        flags.append("threads " + "/".join(str(t) for t in threads))
    if group.efficiency is not None and group.efficiency > SUPERLINEAR:
        flags.append("superlinear")
    return flags


def _superlinear_cause(group: Group, base: Group) -> str:
    threads, base_threads = ({threads_of(run) for run in g.runs} for g in (group, base))
    if threads != base_threads:
        return (f"threads per worker differ ({'/'.join(map(str, sorted(base_threads)))} at {base.workers} "
                f"against {'/'.join(map(str, sorted(threads)))} at {group.workers})")
    if any(was_busy(run) for run in base.runs):
        return f"the {base.workers}-worker runs it is relative to were made on a busy machine"
    if any(oversubscribed(run) for run in base.runs):
        return f"the {base.workers}-worker runs it is relative to oversubscribed their cores"
    return ("each worker's share of the data and model may fit in its caches, or the smaller run was slowed "
            "by something not recorded: repeat both, interleaved (--repeat)")


def _workers(count: int) -> str:
    return f"{count} worker{'s' if count != 1 else ''}"


def family_name(family: Family, differing: tuple[str, ...]) -> str:
    """A family in a sentence: its values of the keys that tell the families apart."""
    said = [f"{key} {family.setting(key)}" for key in differing if family.has_setting(key)]
    return ", ".join(said) if said else f"{family.optimizer} on {family.hardware}"


def fairness_notes(comparison: Comparison) -> list[str]:
    """The sentences under compare's tables about what makes rows unfair or alike."""
    notes = []
    families = comparison.families()
    fingerprints = [dict(f.fingerprint) for f in families]
    # an option that differs only because the optimizers do is said by naming the optimizer
    differing = tuple(key for key, _ in comparison.differences() if not follows_optimizer(key, fingerprints))
    for family, groups in families.items():
        name = f" ({family_name(family, differing)})" if len(families) > 1 else ""
        base = min(groups, key=lambda g: g.workers)
        for group in groups:
            runs = group.runs
            if any(oversubscribed(run) for run in runs):
                run = next(r for r in runs if oversubscribed(r))
                threads = threads_of(run)
                notes.append(f"Oversubscribed{name}: {group.workers} workers x {threads} "
                             f"thread{'s' if threads != 1 else ''} > {_cores(run)} cores; the workers took turns "
                             "on the cores (--threads-per-worker).")
            busy = [run.record.id for run in runs if was_busy(run)]
            if busy:
                notes.append(f"Busy machine{name}, {_workers(group.workers)}: {', '.join(busy)} ran while other work "
                             "loaded the machine (tasks runnable at its start or end beside its own); its "
                             "times are slower for that.")
            if group.efficiency is not None and group.efficiency > SUPERLINEAR and group is not base:
                notes.append(f"Superlinear{name}: {100 * group.efficiency:.0f}% efficiency at {group.workers} workers "
                             f"is a finding to explain, not a result; likely cause: {_superlinear_cause(group, base)}.")
    notes += _indistinguishable(comparison, differing)
    return notes


def _stats(group: Group) -> RepeatStats:
    return group.time_to_accuracy if group.family.metric == "time to accuracy" else group.throughput


def _indistinguishable(comparison: Comparison, differing: tuple[str, ...]) -> list[str]:
    by_workers: dict[int, list[Group]] = {}
    for group in comparison.groups:
        by_workers.setdefault(group.workers, []).append(group)
    notes = []
    for workers, groups in sorted(by_workers.items()):
        for a, b in combinations(groups, 2):
            if a.family.metric != b.family.metric:
                continue
            stats_a, stats_b = _stats(a), _stats(b)
            if stats_a.runs and stats_b.runs and indistinguishable(stats_a, stats_b):
                notes.append(f"Indistinguishable at {_workers(workers)}: "
                             f"{family_name(a.family, differing)} (n={stats_a.runs}) and "
                             f"{family_name(b.family, differing)} (n={stats_b.runs}); their ranges of "
                             f"{'time to goal' if a.family.metric == 'time to accuracy' else a.family.metric} overlap.")
    return notes

"""From what `mlbench run` was asked to its runs: which runs, in which order, and how they ended.

The CLI parses options into a :class:`~mlbench.launch.plan.RunRequest`, picks the launcher
(:func:`mlbench.launch.registry.choose`) and calls :func:`plan_runs` (one request per worker
count and repeat, in rounds, with a shared group id) and :func:`execute` (each run created, run in
the foreground and reported to an :class:`RunObserver`, stopping at a Ctrl-C). Everything here is
callable without a terminal, which is how the tests and the dashboard drive runs.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from mlbench.errors import UsageError
from mlbench.launch.base import EventCallback, Launcher
from mlbench.launch.plan import RunRequest, check_seed
from mlbench.launch.registry import launcher_of
from mlbench.results.store import CANCELLED, FINISHED, RunRecord, RunStore

#: Exit codes of `mlbench run`, `mlbench status RUN --follow` and `mlbench wait` (docs/running.md, "Exit
#: codes"): 3 when every run finished but one missed its goal; 124 (as GNU `timeout`) when
#: `wait --timeout` passed while a run was still going on.
EXIT_OK, EXIT_FAILED, EXIT_MISSED_GOAL, EXIT_TIMEOUT, EXIT_CANCELLED = 0, 1, 3, 124, 130


def open_store(read_only: bool = False) -> RunStore:
    """The current cluster's runs (a mirror of its results service), else this machine's
    (``read_only``: for the commands that only read; such a store creates nothing)."""
    from mlbench.cloud.config import current_cluster

    cluster = current_cluster()
    if cluster is None:
        return RunStore(read_only=read_only)
    from mlbench.launch import kubernetes

    return kubernetes.open_store(cluster)


def cached_store() -> RunStore:
    """The runs as last seen, read without contacting anything: this machine's store, or this
    machine's copy of the current cluster's (shell completion, which must answer at once)."""
    from mlbench.cloud.config import current_cluster

    cluster = current_cluster()
    if cluster is None:
        return RunStore(read_only=True)
    from mlbench.launch.kubernetes import mirror_home

    return RunStore(mirror_home(cluster))


@dataclass
class RunPlan:
    """The runs one `mlbench run` makes, in order; ``group_id`` ties them for `compare --group`;
    ``detach``: its one run starts in the background."""

    requests: list[RunRequest]
    group_id: str | None = None
    detach: bool = False


def plan_runs(base: RunRequest, worker_counts: Sequence[int], repeat: int = 1,
              detach: bool = False, networks: Sequence[Any] = (None,),
              optimizers: Sequence[tuple[str | None, dict[str, str]]] | None = None) -> RunPlan:
    """One request per worker count, optimizer, network setting and repeat (seeds ``base.seed ..
    base.seed + repeat - 1``), in ``repeat`` rounds over the worker counts, optimizers and
    networks, so that a change of load hits every one alike. ``networks``: the emulated networks
    (NetworkSettings; None for the network as it is), one run each, like worker counts;
    ``optimizers``: (name, options) of one run each (None: ``base``'s)."""
    if not worker_counts:
        raise UsageError("give at least one worker count")
    if any(k < 1 for k in worker_counts):
        raise UsageError(f"the number of workers must be at least 1, not {min(worker_counts)}", option="workers")
    if repeat < 1:
        raise UsageError(f"--repeat must be at least 1, not {repeat}", option="repeat")
    check_seed(base.seed, repeat)
    networks = list(networks) or [None]
    choices = list(optimizers or [(base.optimizer, base.optimizer_options)])
    count = len(worker_counts) * repeat * len(networks) * len(choices)
    several = "one worker count" + (", one optimizer" if len(choices) > 1 else "") + \
        (", one bandwidth" if len(networks) > 1 else "") + " and no --repeat"
    if base.name and count > 1:
        raise UsageError(f"--name names one run; give {several} with it", option="name")
    if detach and count > 1:
        raise UsageError(f"--detach starts one run; give {several}, or run without --detach", option="detach")
    group = secrets.token_hex(4) if count > 1 else None
    requests = [dataclasses.replace(base, workers=k, seed=base.seed + r, group_id=group, network=network,
                                    optimizer=name, optimizer_options=dict(options))
                for r in range(repeat) for k in worker_counts for name, options in choices for network in networks]
    return RunPlan(requests, group, detach)


class RunObserver(Protocol):
    """Who watches the runs of a plan (the terminal's progress printer, a test, the dashboard)."""

    def started(self, record: RunRecord, request: RunRequest) -> EventCallback | None:
        """A run is about to start; returns the callback for its events (or None)."""

    def finished(self, record: RunRecord) -> None:
        """A run ended (``record.state`` says how)."""


@dataclass
class Outcome:
    """How the runs of a plan ended."""

    records: list[RunRecord] = field(default_factory=list)
    group_id: str | None = None

    @property
    def cancelled(self) -> bool:
        return any(r.state == CANCELLED for r in self.records)

    @property
    def exit_code(self) -> int:
        """The worst of the runs: cancelled, then failed, then still going on (a `wait` that
        timed out), then a missed goal."""
        if self.cancelled:
            return EXIT_CANCELLED
        if any(not r.active and r.state != FINISHED for r in self.records):
            return EXIT_FAILED
        if any(r.active for r in self.records):
            return EXIT_TIMEOUT
        return EXIT_MISSED_GOAL if any(r.missed_goal for r in self.records) else EXIT_OK


def execute(launcher: Launcher, plan: RunPlan, observer: RunObserver) -> Outcome:
    """Run the plan's runs one after the other in the foreground; a Ctrl-C cancels the current
    run and ends the plan. Every run is validated and recorded just before it starts, so a
    mistake shows before the first run and the later runs use the store's state of that moment."""
    outcome = Outcome(group_id=plan.group_id)
    for workers in sorted({r.workers for r in plan.requests}, reverse=True):
        launcher.check_workers(workers)
    first = launcher.create(plan.requests[0])
    for i, request in enumerate(plan.requests):
        record = first if i == 0 else launcher.create(request)
        on_event = observer.started(record, request)
        try:
            final = launcher.run_attached(record, on_event)
        except KeyboardInterrupt:  # Ctrl-C while starting: nothing more to run
            final = launcher.cancel(record)
        outcome.records.append(final)
        observer.finished(final)
        if final.state == CANCELLED:
            break
    return outcome


def create_all(launcher: Launcher, plan: RunPlan) -> list[RunRecord]:
    """Record every run of the plan, pending, to be started later (the dashboard's queue);
    every run is checked before the first is recorded, so that nothing is recorded when one is
    wrong."""
    from mlbench.launch.plan import build_config
    from mlbench.optim.descriptors import check_optimizer

    for workers in sorted({r.workers for r in plan.requests}, reverse=True):
        launcher.check_workers(workers)
    for request in plan.requests:
        config, _ = build_config(request)
        check_optimizer(config.optimizer, request.optimizer_options, request.workers)
    return [launcher.create(request) for request in plan.requests]


def start_detached(launcher: Launcher, plan: RunPlan) -> RunRecord:
    """Record the plan's single run and start it in the background."""
    launcher.check_workers(plan.requests[0].workers)
    record = launcher.create(plan.requests[0])
    launcher.start_detached(record)
    return record


class _Deadline(Exception):
    """The time a `wait` was given is spent."""


def wait_for_runs(store: RunStore, records: Sequence[RunRecord], timeout_s: float | None = None,
                  on_end: Callable[[RunRecord], None] | None = None,
                  clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> Outcome:
    """Wait until every run of ``records`` has ended, or ``timeout_s`` has passed, without
    touching the runs: a script's `mlbench run --detach` then `mlbench wait`. Each run is
    followed by its own launcher (:meth:`~mlbench.launch.base.Launcher.follow`, which bears a
    controller or results service that is briefly unreachable); ``on_end`` hears of each run
    as it is seen ended. The outcome holds every run as last seen: its
    :attr:`~Outcome.exit_code` is what `mlbench run` would have exited with, or
    :data:`EXIT_TIMEOUT` for a run still going on."""
    deadline = None if timeout_s is None else clock() + timeout_s

    def pause(seconds: float) -> None:
        if deadline is not None:
            left = deadline - clock()
            if left <= 0:
                raise _Deadline
            seconds = min(seconds, left)
        sleep(seconds)

    outcome = Outcome()
    for i, record in enumerate(records):
        launcher = launcher_of(store, record)
        try:
            final = launcher.follow(launcher.reconcile(record), sleep=pause)
        except _Deadline:
            for late in records[i:]:
                last = launcher_of(store, late).reconcile(store.get(late.id))
                outcome.records.append(last)
                if on_end is not None and not last.active:
                    on_end(last)
            return outcome
        outcome.records.append(final)
        if on_end is not None:
            on_end(final)
    return outcome

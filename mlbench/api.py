"""mlbench's public Python API: start runs, list them and read what they recorded, from a script
or a notebook, without the terminal (``import mlbench; mlbench.run("task2a", 2, ...)``).

The CLI is a thin layer over this module: `mlbench run` builds its runs with :func:`plan` (the
options of :func:`run` and of `mlbench run` are the same options, checked by a test), `mlbench
status` lists with :func:`runs` and shows one run as :func:`get` does. So what a script reads is
what `mlbench status -o json` prints: :meth:`RunInfo.to_dict` is a `status -o json` entry and
:meth:`Run.to_dict` the document of `status RUN -o json` (less its ``schema_version``).

Like SkyPilot's ``sky.launch``/``sky.status`` and MLflow's client: typed, frozen dataclasses;
keyword-only options; every mistake an exception of :mod:`mlbench.errors` (never an exit and
never a printed line). Nothing here imports torch: the workers do, in their own processes.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlbench.errors import MlbenchError, UsageError, about_option
from mlbench.launch import session
from mlbench.launch.base import NO_STEP_CAP, EventCallback, Progress, quiet
from mlbench.launch.options import (api_signature, checked_value, nearest, optimizer_names, options_by_optimizer,
                                    request_fields, shown, values_with_defaults)
from mlbench.launch.plan import RunRequest
from mlbench.launch.registry import choose, launcher_of, launcher_options
from mlbench.network.settings import network_options
from mlbench.results.events import read_run_events
from mlbench.results.live_export import parse_targets
from mlbench.results.report import parse_sort, run_details, run_overview, sort_runs
from mlbench.results.store import RunRecord, RunStore
from mlbench.results.summary import summarize

if TYPE_CHECKING:
    import pandas

#: The columns of :meth:`RunInfo.events`, one row per metric event (mlbench.results.events).
EVENT_COLUMNS = ("time", "rank", "epoch", "step", "name", "value")


def _plain(value: Any) -> Any:
    """``value`` as JSON has it: tuples as lists, non-finite floats as None (what `-o json` prints)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


#: Where runs are kept: a folder (an MLBENCH_HOME), an open store (the dashboard's sources), or
#: None for the current one (a cluster's, else this machine's).
Home = str | os.PathLike[str] | RunStore | None


def _refuse(name: str, value: Any, wanted: str) -> UsageError:
    """The UsageError of a keyword given a value it does not take: one line that names it."""
    return UsageError(f"{name}={shown(value)}: give {wanted}", option=name)


def _callback(name: str, value: Any) -> None:
    if value is not None and not callable(value):
        raise _refuse(name, value, "a function, or None")


def _store(home: Home, read_only: bool = False, *, new: bool = False) -> RunStore:
    """The run store at ``home``, else the current one (a cluster's, else this machine's). A
    folder that does not exist holds no runs to read: a UsageError, unless the caller records
    runs (``new``: the store is made there, as for a new MLBENCH_HOME)."""
    if isinstance(home, RunStore):
        return home
    if home is None:
        return session.open_store(read_only=read_only)
    if isinstance(home, bool) or not isinstance(home, (str, os.PathLike)):
        raise _refuse("home", home, "a run store's folder (text or a path), an open RunStore, or None for the "
                                    "current store")
    folder = Path(home).expanduser()
    if not new and not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise about_option(UsageError(f"home {str(home)!r} {what}: give the folder of a run store (an MLBENCH_HOME), "
                                      "or None for the current store"), "home")
    return RunStore(folder, read_only=read_only)


@dataclass(frozen=True, kw_only=True)
class RunInfo:
    """One run as a row of `mlbench status`: identity, state and how far it got (the keys of a
    `status -o json` entry, README "Machine-readable output"). Times are unix seconds."""

    id: str
    name: str
    task: str
    workers: int                   # the size it started at
    workers_text: str              # "4", or "4 -> 3" after --on-failure shrink (docs/faults.md)
    state: str                     # pending, running, finished, failed, cancelled
    reason: str | None
    restarts: int                  # how often the group started again after a failure (restarts, shrinks)
    division: str                  # closed or open
    optimizer: str
    model: str | None              # a model plug-in's NAME@SHA12; None: the task's own model
    framework: str
    network: str | None            # the emulated network ("10 Mbit/s, 5 ms"); None: not shaped
    division_text: str             # "closed", or "open: " and why (mlbench.results.division)
    open_reasons: list[str]        # what made the run open division; empty for a closed run
    launcher: str
    seed: int | None
    group_id: str | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    epoch: float | None
    metric: str
    metric_value: float | None
    metric_title: str
    metric_unit: str
    metric_text: str
    goal: float | None
    goal_reached: bool | None
    time_to_accuracy: float | None
    #: the run's folder (run.json, events/, logs/)
    run_dir: Path
    _record: RunRecord = field(repr=False, compare=False)
    _store: RunStore = field(repr=False, compare=False)

    @classmethod
    def _fields(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.name not in ("run_dir", "_record", "_store")]

    def to_dict(self) -> dict[str, Any]:
        """The run as `mlbench status -o json` prints it (plain JSON values, without
        ``schema_version``)."""
        return _plain({name: getattr(self, name) for name in self._fields()})

    def entry(self) -> dict[str, Any]:
        """The run as an entry of `mlbench status -o json` (for a :class:`Run` too, whose
        :meth:`to_dict` is the longer document of `status RUN -o json`)."""
        return _plain({name: getattr(self, name) for name in RunInfo._fields()})

    @property
    def record(self) -> RunRecord:
        """The run's row of the catalog, as last read (what the library's functions take)."""
        return self._record

    def start(self) -> Run:
        """Start this pending run (:func:`create`) in the background, through its launcher; a run
        that is no longer pending (cancelled or deleted while it waited) is returned as it is."""
        record = self._store.get(self.id)
        if record.state == "pending":
            launcher_of(self._store, record).start_detached(record)
        return _details(self._store, self._store.get(self.id))

    def where(self) -> str:
        """Where a started run goes on, in words its launcher chooses ("in the background", "as
        Slurm job 12")."""
        return launcher_of(self._store, self._record).where(self._record)

    @property
    def active(self) -> bool:
        """Still pending or running (as last read)."""
        return self._record.active

    @property
    def exit_code(self) -> int:
        """What `mlbench run` exits with for this run: 0, 1 failed, 3 missed its goal, 130
        cancelled; 124 while it is still going on (as `mlbench wait --timeout`)."""
        return session.Outcome([self._record]).exit_code

    def events(self, frame: bool | None = None) -> pandas.DataFrame | list[dict[str, Any]]:
        """Every metric event the run's workers recorded, one row each, ordered by time, with the
        columns :data:`EVENT_COLUMNS` (``value`` is a number, or a dict for ``result``,
        ``environment`` and ``allreduce``). A pandas DataFrame when pandas is installed, else a
        list of dicts; ``frame`` True asks for the DataFrame (an error without pandas), False
        for the list."""
        if frame is not None and not isinstance(frame, bool):
            raise _refuse("frame", frame, "True (a DataFrame), False (a list) or None (either)")
        rows = [{column: event.get(column) for column in EVENT_COLUMNS}
                for event in read_run_events(self.run_dir)]
        if frame is False:
            return rows
        try:
            import pandas
        except ImportError:
            if frame:
                raise MlbenchError("events as a DataFrame need pandas: pip install pandas") from None
            return rows
        return pandas.DataFrame(rows, columns=list(EVENT_COLUMNS))

    def refresh(self) -> Run:
        """The run as it is now (its state, its metrics so far)."""
        return _details(self._store, self._store.get(self.id))

    def wait(self, timeout: float | None = None) -> Run:
        """Wait until the run has ended (or ``timeout`` seconds have passed: then it is still
        :attr:`active`), as `mlbench wait` does, and return it as it is then."""
        outcome = session.wait_for_runs(self._store, [self._record], _timeout(timeout))
        return _details(self._store, outcome.records[0])


@dataclass(frozen=True, kw_only=True)
class Run(RunInfo):
    """One run with everything `mlbench status RUN` shows: the summary of its metric events over
    every worker, its systems metrics, its result as recorded and the result sentence, its
    checkpoints and resumes, its faults."""

    summary: dict[str, Any]
    system: dict[str, Any] | None   # peak memory, step-time spread, FLOP/s (docs/system-metrics.md)
    optimizer_plugin: dict[str, Any] | None
    model_plugin: dict[str, Any] | None
    result: dict[str, Any] | None
    result_sentence: str | None
    checkpoints: dict[str, Any] | None
    resumes: list[dict[str, Any]]
    faults: dict[str, Any] | None   # injected faults, restarts, goodput (docs/faults.md)
    #: faults, restarts and resumes in time order, each failure's errors under it, and the errors
    #: of the group that ran last (mlbench.results.timeline)
    timeline: dict[str, Any]
    allreduce: dict[str, Any] | None = None   # task0a: the latency and bandwidth sweep

    def to_dict(self) -> dict[str, Any]:
        """The run as `mlbench status RUN -o json` prints it (without ``schema_version``)."""
        data = super().to_dict()
        if self.allreduce is None:
            del data["allreduce"]
        return data


def _overview(store: RunStore, record: RunRecord) -> RunInfo:
    return RunInfo(**run_overview(record), run_dir=record.run_dir, _record=record, _store=store)


def _details(store: RunStore, record: RunRecord) -> Run:
    record = launcher_of(store, record).reconcile(record)
    events = read_run_events(record.run_dir)
    document = run_details(record, summarize(events), events)
    return Run(**document, run_dir=record.run_dir, _record=record, _store=store)


def runs(*, sort: str = "-created_at", limit: int | None = None,
         home: Home = None) -> list[RunInfo]:
    """The runs of the store (``home``, else the current cluster's, else this machine's), each as
    its launcher sees it now, ordered by ``sort`` (a field of :class:`RunInfo`; ``-FIELD``
    descending; runs without a value last), the first ``limit`` of them. As `mlbench status`."""
    if not isinstance(sort, str):
        raise _refuse("sort", sort, 'a field of RunInfo as text, e.g. "workers" or "-created_at"')
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
        raise _refuse("limit", limit, "a whole number of runs, or None for every run")
    field_name, descending = parse_sort(sort)
    if limit is not None and limit < 1:
        raise about_option(UsageError(f"limit {limit}: give at least 1, or None for every run"), "limit")
    store = _store(home, read_only=True)
    found = [_overview(store, launcher_of(store, r).reconcile(r)) for r in store.list()]
    by_id = {info.id: info for info in found}
    ordered = sort_runs([info.to_dict() for info in found], field_name, descending)
    return [by_id[row["id"]] for row in ordered[:limit]]


def _ref(run: Any) -> str:
    """A run's id, id prefix or name, checked to be text (``get(123)`` is a usage error)."""
    if not isinstance(run, str) or not run.strip():
        raise UsageError(f"run {run!r}: give a run's id, a prefix of it or its name, as text")
    return run


def get(run: str, *, home: Home = None) -> Run:
    """One run by id, id prefix or name, as its launcher sees it now (:class:`Run`); raises
    :class:`~mlbench.errors.RunNotFound` when none matches. As `mlbench status RUN`."""
    store = _store(home, read_only=True)
    return _details(store, store.get(_ref(run)))


def _worker_counts(workers: Any) -> list[int]:
    """The worker counts as whole numbers (``2.5``, ``"2"`` and ``True`` are refused here, before
    anything is recorded)."""
    counts = [workers] if isinstance(workers, int) else list(workers) if isinstance(workers, (list, tuple)) else None
    if counts is None or any(isinstance(k, bool) or not isinstance(k, int) for k in counts):
        raise about_option(UsageError(f"workers {workers!r}: give a whole number of workers (or a list of them "
                                      "for plan)"), "workers")
    return counts


def plan(task: str, workers: Sequence[int], **options: Any) -> session.RunPlan:
    """The runs `mlbench run TASK WORKERS... [options]` makes, checked, before anything is
    recorded: one request per worker count, network and repeat. The one translation of
    `mlbench run`'s options (:data:`mlbench.launch.options.RUN_OPTIONS`, by their API names)
    into run requests, for the CLI, :func:`run` and the dashboard's form alike. An unknown
    option is a UsageError naming the nearest one. ``watchdog``: a duration, or None (or "off")
    for none."""
    if not isinstance(task, str):
        raise _refuse("task", task, 'a task\'s name as text, e.g. "task2a" (`mlbench tasks` lists them)')
    counts = _worker_counts(workers)
    values = values_with_defaults(options, "mlbench.plan")
    names = optimizer_names(values.get("optimizer"))
    base = RunRequest(task=task, workers=counts[0] if counts else 1,
                      **request_fields({**values, "optimizer": names[0] if names else None}))
    optimizers = options_by_optimizer(names, base.optimizer_options) or None
    plan_values = {name: checked_value(name, values) for name in ("repeat", "detach")}
    try:
        networks = network_options(*(checked_value(name, values)
                                     for name in ("bandwidth", "latency", "jitter", "loss", "shaping")))
    except UsageError as err:
        raise about_option(err, "bandwidth") from None
    return session.plan_runs(base, counts, plan_values["repeat"], detach=plan_values["detach"], networks=networks,
                             optimizers=optimizers)


plan.__signature__ = api_signature(  # type: ignore[attr-defined]
    inspect.Parameter("task", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="str"),
    inspect.Parameter("workers", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="Sequence[int]"),
    skip=("log_to",))


def _check_launch(launch: Mapping[str, Any]) -> None:
    """Refuse a launcher option that no launcher declares (``{"slrum": True}``), naming the
    nearest, instead of running elsewhere than asked."""
    if not isinstance(launch, Mapping):
        raise _refuse("launch", launch, 'a mapping of launcher options by name, e.g. {"slurm": True}, or None')
    declared = {option.name for option in launcher_options()}
    for key in launch:
        if key not in declared:
            hint = nearest(key, declared, f"the launchers' options are {', '.join(sorted(declared))}")
            raise UsageError(f"launch: no launcher option {key!r}{hint}")


@dataclass(frozen=True, kw_only=True)
class Started:
    """What :func:`start` did with a plan's runs: each run as it is now (ended, started in the
    background, or recorded for the user's own launcher), the exit code `mlbench run` would
    give, where a background run goes on, and a record-only run's worker commands."""

    runs: list[Run]
    exit_code: int
    cancelled: bool
    where: str
    worker_commands: dict[str, list[tuple[str, str]]]


def start(request_plan: session.RunPlan, *, launch: Mapping[str, Any] | None = None, home: Home = None,
          progress: Progress = quiet, log_to: Sequence[str] | None = None,
          observer: session.RunObserver | None = None) -> Started:
    """Record and start the runs of ``request_plan`` (:func:`plan`) with the launcher the
    options in ``launch`` choose: one after the other in the foreground (``observer`` hears
    each start and end), one in the background for a plan made with ``detach``, or only
    recorded for a ``--record-only`` launcher. The one way the CLI and :func:`run` start runs."""
    _check_plan(request_plan)
    _callback("progress", progress)
    if observer is not None and not all(callable(getattr(observer, name, None)) for name in ("started", "finished")):
        raise _refuse("observer", observer, "an object with started(record, request) and finished(record), or None")
    log_to = checked_value("log_to", {"log_to": log_to})
    if log_to and request_plan.detach:
        raise about_option(UsageError("log_to writes a run as it is followed; a detached run is followed by "
                                      "nobody: leave out detach, or `mlbench export RUN --to TOOL DIR` when it "
                                      "has ended"), "log_to")
    targets = parse_targets(log_to or ())
    _check_launch({} if launch is None else launch)
    store = _store(home, new=True)
    launcher = choose(store, dict(launch or {}), progress=progress)
    launcher.settings.log_to = targets
    if launcher.records_only:
        if log_to:
            raise about_option(UsageError("log_to writes a run as it is followed; a record-only run starts none"),
                               "log_to")
        for workers in sorted({r.workers for r in request_plan.requests}, reverse=True):
            launcher.check_workers(workers)
        records = [launcher.create(request) for request in request_plan.requests]
        return Started(runs=[_details(store, r) for r in records], exit_code=0, cancelled=False,
                       where=launcher.where(records[0]),
                       worker_commands={r.id: launcher.worker_commands(r) for r in records})
    if request_plan.detach:
        record = session.start_detached(launcher, request_plan)
        return Started(runs=[_details(store, record)], exit_code=0, cancelled=False, where=launcher.where(record),
                       worker_commands={})
    outcome = session.execute(launcher, request_plan, observer or _Listener(None))
    return Started(runs=[_details(store, r) for r in outcome.records], exit_code=outcome.exit_code,
                   cancelled=outcome.cancelled, where="", worker_commands={})


def run(task: str, workers: int, *, launch: Mapping[str, Any] | None = None,
        home: Home = None, on_event: EventCallback | None = None,
        progress: Progress = quiet, **options: Any) -> Run:
    """Run TASK on WORKERS workers and return the run once it has ended (``detach``: once it has
    started in the background; :meth:`Run.wait` waits for it). The options are `mlbench run`'s,
    by the names of :data:`mlbench.launch.options.RUN_OPTIONS` (``--set`` is ``overrides``,
    ``--opt`` ``optimizer_options``, ``--no-stop`` ``stop_at_goal=False``, ``--no-timing``
    ``timing=False``, ``--no-graph`` ``graph=False``; ``launch`` holds a launcher's options by
    name, e.g. ``{"slurm": True, "partition": "gpu"}``).

    The run is kept in the store at ``home`` (else the current one: a cluster's, else this
    machine's MLBENCH_HOME) and listed by `mlbench status` like any other. ``on_event`` hears
    rank 0's metric events as they come; ``progress`` the launcher's lines (an image built, a
    cluster reached). A KeyboardInterrupt cancels the run, which is returned cancelled. A run
    that fails is returned (``state`` "failed", ``reason`` why); a mistake in the options raises
    :class:`~mlbench.errors.UsageError` before anything is recorded.
    """
    if "repeat" in options:
        raise about_option(UsageError("mlbench.run makes one run: use plan (or mlbench run --repeat) for repeats"),
                           "repeat")
    log_to = options.pop("log_to", None)
    _callback("on_event", on_event)
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise about_option(UsageError(f"workers {workers!r}: mlbench.run takes one whole number of workers "
                                      "(plan takes several)"), "workers")
    request_plan = plan(task, [workers], **options)
    if len(request_plan.requests) != 1:
        raise UsageError("mlbench.run makes one run: give one bandwidth (a comma list makes one run each)")
    started = start(request_plan, launch=launch, home=home, progress=progress, log_to=log_to,
                    observer=_Listener(on_event))
    return started.runs[0]


def create(request_plan: session.RunPlan, *, home: Home = None) -> list[RunInfo]:
    """Record the runs of ``request_plan`` on this machine's or the current cluster's launcher,
    pending, without starting them: every run is checked before the first is recorded. Each is
    started later with :meth:`RunInfo.start` (the dashboard's queue starts them one after
    another, as `mlbench run` runs them)."""
    _check_plan(request_plan)
    store = _store(home, new=True)
    launcher = choose(store, {})
    return [_overview(store, record) for record in session.create_all(launcher, request_plan)]


def cancel(run: str, *, home: Home = None) -> Run:
    """Stop a pending or running run through its own launcher (SIGTERM to its supervisor,
    ``scancel``, its pods deleted), as `mlbench cancel` and the dashboard do; what it recorded
    is kept. A run that has ended is returned as it is."""
    store = _store(home)
    record = store.get(_ref(run))
    if record.active:
        record = launcher_of(store, record).cancel(record)
    return _details(store, record)


def delete(run: str, *, home: Home = None) -> RunInfo:
    """Delete a run and everything it recorded (cancelled first when active), as `mlbench
    delete`; returns it as it was last seen."""
    store = _store(home)
    record = store.get(_ref(run))
    if record.active:
        record = launcher_of(store, record).cancel(record)
    info = _overview(store, record)
    store.delete(record.id)
    return info


def resume(run: str, *, max_steps: int | str | None = None, detach: bool = False,
           on_event: EventCallback | None = None, on_start: Callable[[Run], None] | None = None,
           home: Home = None) -> Run:
    """Continue a stopped, failed or cancelled run from its newest complete checkpoint, as the
    same run (`mlbench resume`): ``max_steps`` replaces its step cap (``"off"``: none);
    ``detach`` starts it in the background. ``on_start`` hears the run once it is ready to go on
    (its ``resume_step`` named), before it trains; ``on_event`` its rank 0's events. A
    KeyboardInterrupt cancels it. Returns the run as it is then."""
    cap = _step_cap(max_steps)
    if not isinstance(detach, bool):
        raise _refuse("detach", detach, "True or False")
    _callback("on_event", on_event)
    _callback("on_start", on_start)
    store = _store(home)
    record = store.get(_ref(run))
    launcher = launcher_of(store, record)
    record = launcher.prepare_resume(launcher.reconcile(record), cap)
    if on_start is not None:
        on_start(_details(store, record))
    if detach:
        launcher.start_detached(record)
        return _details(store, store.get(record.id))
    try:
        final = launcher.run_attached(record, on_event)
    except KeyboardInterrupt:
        final = launcher.cancel(record)
    return _details(store, final)


def _step_cap(max_steps: int | str | None) -> int | None:
    """`resume --max-steps`: N (at least 1), 'off' (no cap: NO_STEP_CAP) or not given (None)."""
    if max_steps is None:
        return None
    if isinstance(max_steps, str):
        if max_steps.strip().lower() == "off":
            return NO_STEP_CAP
        try:
            max_steps = int(max_steps)
        except ValueError:
            raise about_option(UsageError(f"--max-steps {max_steps!r}: give a whole number of steps, or off"),
                               "max_steps") from None
    if isinstance(max_steps, bool) or not isinstance(max_steps, int):
        raise _refuse("max_steps", max_steps, 'a whole number of steps, "off" or None')
    if max_steps < 1:
        raise about_option(UsageError("--max-steps must be at least 1"), "max_steps")
    return max_steps


def _timeout(timeout: float | None) -> float | None:
    """A wait's ``timeout``: seconds above 0, or None (no limit)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise _refuse("timeout", timeout, "a number of seconds above 0, or None")
    return float(timeout)


def _check_plan(request_plan: Any) -> None:
    if not isinstance(request_plan, session.RunPlan):
        raise _refuse("request_plan", request_plan, "the plan that mlbench.api.plan returns")


def follow(run: str, *, on_event: EventCallback | None = None, home: Home = None) -> Run:
    """Pass a run's rank 0 events to ``on_event`` (those so far, then new ones as they come)
    until it ends, whoever started it, as `mlbench status RUN --follow`; returns it then."""
    _callback("on_event", on_event)
    store = _store(home, read_only=True)
    record = store.get(_ref(run))
    launcher = launcher_of(store, record)
    return _details(store, launcher.follow(launcher.reconcile(record), on_event))


def wait(runs: Sequence[str], *, timeout: float | None = None, on_end: Callable[[RunInfo], None] | None = None,
         home: Home = None) -> tuple[int, list[RunInfo]]:
    """Wait until every run has ended, or ``timeout`` seconds have passed, without touching
    them (`mlbench wait`): the exit code `mlbench run` would give for them (124 while one is still
    going on) and each run as last seen; ``on_end`` hears each run as it is seen ended."""
    if not isinstance(runs, (list, tuple)):
        raise _refuse("runs", runs, "a list of run ids, id prefixes or names (one run: [RUN])")
    timeout = _timeout(timeout)
    _callback("on_end", on_end)
    store = _store(home, read_only=True)
    records = [store.get(_ref(ref)) for ref in runs]
    outcome = session.wait_for_runs(store, records, timeout,
                                    on_end=(lambda r: on_end(_overview(store, r))) if on_end else None)
    return outcome.exit_code, [_overview(store, r) for r in outcome.records]


def compare(runs: Sequence[str] = (), *, task: str | None = None, group: str | None = None,
            pool: Sequence[str] = (), score: str = "median", instance: str | None = None,
            price_per_hour: float | None = None, home: Home = None) -> dict[str, Any]:
    """The comparison of finished runs of one task, as `mlbench compare -o json` prints it (less
    its ``schema_version``): the families (runs equal in everything that changes what they
    compute), each with its rows per worker count (repeats' median and range of time to goal,
    speedup, efficiency, compute vs communication, cost) and the settings in which families
    differ. The runs are chosen as `compare` chooses them: ids, id prefixes or names
    (``runs``), every finished run of ``task``, or the runs of ``group`` (one `--repeat` or
    sweep); ``pool`` names fingerprint keys to pool on purpose; ``score`` is ``"median"`` or
    ``"mlperf"``; ``instance`` or ``price_per_hour`` prices them."""
    from mlbench.results.compare import comparison_of
    from mlbench.results.report import comparison_document

    if not isinstance(runs, (list, tuple)):
        raise _refuse("runs", runs, "a list of run ids, id prefixes or names (one run: [RUN])")
    if not isinstance(pool, (list, tuple)) or not all(isinstance(key, str) for key in pool):
        raise _refuse("pool", pool, 'a list of fingerprint keys as text, e.g. ["seed"]')
    for name, value in (("task", task), ("group", group), ("instance", instance)):
        if value is not None and not isinstance(value, str):
            raise _refuse(name, value, "text, or None")
    if not isinstance(score, str):
        raise _refuse("score", score, '"median" or "mlperf"')
    if price_per_hour is not None and (isinstance(price_per_hour, bool)
                                       or not isinstance(price_per_hour, (int, float))):
        raise _refuse("price_per_hour", price_per_hour, "US dollars per node-hour as a number, or None")
    refs = tuple(_ref(ref) for ref in runs)
    comparison = comparison_of(_store(home, read_only=True), refs, task, group, instance,
                               None if price_per_hour is None else float(price_per_hour), None,
                               pool=tuple(pool), score=score)
    document = comparison_document(comparison)
    document.pop("schema_version", None)
    return document


run.__signature__ = api_signature(  # type: ignore[attr-defined]
    inspect.Parameter("task", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="str"),
    inspect.Parameter("workers", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="int"),
    skip=("repeat",),
    trailing=[inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
              for name, default, annotation in (("launch", None, "Mapping[str, Any] | None"),
                                                ("home", None, "Home"),
                                                ("on_event", None, "EventCallback | None"),
                                                ("progress", quiet, "Progress"))])


class _Listener:
    """The observer of :func:`run`: passes rank 0's events on, prints nothing."""

    def __init__(self, on_event: EventCallback | None) -> None:
        self.on_event = on_event

    def started(self, record: RunRecord, request: RunRequest) -> EventCallback | None:
        return self.on_event

    def finished(self, record: RunRecord) -> None:
        pass


__all__ = ["EVENT_COLUMNS", "Run", "RunInfo", "Started", "cancel", "delete", "follow", "get", "plan", "resume",
           "run", "runs", "start", "wait"]

"""The interface every launcher implements: how a run's workers are started and followed.

A launcher owns one run store (this machine's, or a cluster's mirror) and answers five requests:
record a new run (:meth:`Launcher.create`, which validates everything that can be validated
before anything exists), run it in the foreground while reporting its events, start it in the
background, cancel it, and tell its true state (:meth:`Launcher.reconcile`: a run whose
processes, job or pods vanished is marked as such the next time anything looks).

Each launcher class also declares what the rest of mlbench would otherwise ask by its name: the
`mlbench run` options that choose and configure it (:class:`LauncherOption`), the machines a run
occupies (:meth:`Launcher.occupied_nodes`, recorded in run.json when the run is created, so that
results code never needs to know launchers), whether those are this machine, and how it shapes
an emulated network (:meth:`Launcher.network_record`). The launchers are found through
:mod:`mlbench.launch.registry` only.

:meth:`Launcher.follow` is the one loop that passes rank 0's events on while a run goes (the
foreground run of every launcher and `status --follow` use it); :meth:`Launcher.logs` reads a
worker's output from the run folder unless a launcher knows better.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from mlbench.errors import MlbenchError, UsageError
from mlbench.results.checkpoints import checkpoint_root, complete_checkpoints, newest_valid
from mlbench.launch.follow import check_rank, follow_file
from mlbench.launch.plan import LauncherAbilities, RunRequest, WorkerResources, create_run
from mlbench.launch.run_folder import back_to_newest_checkpoint, changes_since_created, events_path, log_path
from mlbench.network.settings import NetworkSettings
from mlbench.results.events import EventTail
from mlbench.results.live_export import LiveExport, Target
from mlbench.results.store import FINISHED, RunRecord, RunStore
from mlbench.run_config import RunDocument

#: `mlbench resume --max-steps off`: no step cap.
NO_STEP_CAP = 0

#: Called with each of rank 0's metric events while a run is followed in the foreground.
EventCallback = Callable[[dict[str, Any]], None]
#: Where a launcher says what it does while a run starts (the terminal's lines).
Progress = Callable[[str], None]


def quiet(_: str) -> None:
    """No progress lines."""


@dataclass(frozen=True)
class LauncherOption:
    """One `mlbench run` option that a launcher adds, described without click (the CLI turns it
    into a click option): its flag, the name its value is passed under, and its help."""

    flag: str
    name: str
    help: str
    type: type = str
    is_flag: bool = False
    multiple: bool = False
    metavar: str | None = None


@dataclass
class LaunchSettings:
    """What new runs were asked with beyond their :class:`RunRequest`: the values of the
    launcher's own options (by :attr:`LauncherOption.name`) and where its progress lines go."""

    options: dict[str, Any] = field(default_factory=dict)
    progress: Progress = quiet
    #: ``--log-to`` targets: each run followed in the foreground is written there as it goes
    log_to: tuple[Target, ...] = ()


class Launcher(ABC):
    """Starts and follows the runs of one store."""

    #: The name a run records (``RunRecord.launcher``) and the registry knows it by.
    name: ClassVar[str] = ""
    #: How a sentence names its runs ("Slurm runs").
    label: ClassVar[str] = ""
    #: The option that chooses this launcher for `mlbench run`; None: chosen otherwise
    #: (:meth:`chosen`).
    choose_option: ClassVar[LauncherOption | None] = None
    #: How a user chooses it, said after "an option of LABEL runs; ".
    how_to_choose: ClassVar[str] = ""
    #: Its further `mlbench run` options, valid only when it is chosen.
    options: ClassVar[tuple[LauncherOption, ...]] = ()
    #: Whether its workers run on this machine (a local run costs nothing unless priced).
    on_this_machine: ClassVar[bool] = False
    #: Whether it only records runs, whose workers the user starts (:meth:`worker_commands`).
    records_only: ClassVar[bool] = False
    #: Seconds between two looks at a followed run.
    follow_seconds: ClassVar[float] = 0.5
    #: How long a follow goes on while the launcher cannot say how the run is (a scheduler's
    #: controller restarting, a cluster's API server blipping); 0: not at all.
    unreachable_seconds: ClassVar[float] = 0.0
    #: The most bytes of a plug-in optimizer's source it can ship to its workers; None: they
    #: read it from the run folder they share with this machine.
    plugin_limit: ClassVar[int | None] = None
    #: Whether `mlbench resume` can start its runs again from a checkpoint.
    resumable: ClassVar[bool] = False
    #: The frameworks, injected faults and recovery policies it handles (PyTorch only, none).
    abilities: ClassVar[LauncherAbilities] = LauncherAbilities()

    def __init__(self, store: RunStore, settings: LaunchSettings | None = None):
        self.store = store
        self.settings = settings or LaunchSettings()

    # -- what the launcher declares -------------------------------------------------------------
    @classmethod
    def chosen(cls, store: RunStore, values: dict[str, Any]) -> bool:
        """Whether `mlbench run` with option ``values`` over ``store`` asks for this launcher."""
        return cls.choose_option is not None and bool(values.get(cls.choose_option.name))

    @classmethod
    def chosen_by(cls) -> str:
        """What chooses this launcher, in words (its option's flag unless it says otherwise)."""
        return cls.choose_option.flag if cls.choose_option else f"the {cls.name} launcher"

    @classmethod
    def serves(cls, store: RunStore) -> bool:
        """Whether this launcher can keep its runs in ``store`` (by default this machine's)."""
        return type(store) is RunStore

    def check_options(self) -> None:  # noqa: B027 - optional hook, a no-op unless overridden
        """Refuse (UsageError) option values this launcher cannot use, before any run exists."""

    def check_workers(self, workers: int) -> None:  # noqa: B027 - optional hook, a no-op unless overridden
        """Refuse (UsageError) a worker count this launcher cannot start; by default any count
        goes (a cluster's scheduler or Slurm's controller says why it cannot place the run)."""

    @abstractmethod
    def occupied_nodes(self, request: RunRequest, resources: WorkerResources | None) -> int:
        """The machines a run of ``request`` occupies, as far as it is known when it is created
        (recorded in run.json; a launcher may correct it once it knows better)."""

    def network_record(self, settings: NetworkSettings) -> dict[str, Any]:
        """The ``network`` section of run.json for an emulated network: the settings and how
        this launcher applies them; UsageError when it cannot (before the run is recorded)."""
        raise UsageError(f"network emulation is not available for {self.label} runs; leave out "
                         "--bandwidth, --latency, --jitter and --loss")

    # -- what it does -------------------------------------------------------------------------
    def record(self, request: RunRequest, resources: WorkerResources | None = None,
               check_data: bool = True) -> RunRecord:
        """Record a pending run of ``request`` as this launcher's, with the machines it occupies
        and its network."""
        network = self.network_record(request.network) if request.network else None
        return create_run(self.store, request, launcher=self.name, abilities=self.abilities, label=self.label,
                          check_data=check_data,
                          resources=resources, nodes=self.occupied_nodes(request, resources),
                          on_this_machine=self.on_this_machine, network=network,
                          plugin_limit=self.plugin_limit)

    @abstractmethod
    def create(self, request: RunRequest) -> RunRecord:
        """Validate ``request`` for this launcher and record a pending run (nothing started)."""

    @abstractmethod
    def run_attached(self, record: RunRecord, on_event: EventCallback | None = None) -> RunRecord:
        """Start the run and follow it to its end; Ctrl-C cancels it. Returns the final record."""

    @abstractmethod
    def start_detached(self, record: RunRecord) -> None:
        """Start the run in the background and return at once."""

    @abstractmethod
    def cancel(self, record: RunRecord) -> RunRecord:
        """End an active run as cancelled, stopping its workers; what it recorded is kept."""

    @abstractmethod
    def reconcile(self, record: RunRecord) -> RunRecord:
        """The run's true state now (a run whose workers vanished is marked failed)."""

    def prepare_resume(self, record: RunRecord, max_steps: int | None = None) -> RunRecord:
        """Make an ended run ready to go on from its newest complete checkpoint
        (:func:`reopen_from_checkpoint`); then :meth:`run_attached` or :meth:`start_detached`
        starts it as any pending run. One UsageError line for a run that cannot resume."""
        if not self.resumable:
            raise UsageError(f"run {record.id} is a {self.label} run: `mlbench resume` continues the runs of "
                             "this machine, Slurm and Kubernetes")
        return reopen_from_checkpoint(self.store, record, max_steps, self.before_resume)

    def before_resume(self, record: RunRecord) -> None:  # noqa: B027 - optional hook, a no-op unless overridden
        """Clear what the run's last start left outside its folder that would mislead the next
        one (the run folder's own leftovers: :func:`~mlbench.launch.run_folder.back_to_newest_checkpoint`)."""

    def worker_commands(self, record: RunRecord) -> list[tuple[str, str]]:
        """For a launcher that only records runs: ways to start the run's workers, as (where,
        command)."""
        return []

    def where(self, record: RunRecord) -> str:
        """How a started run is said to go on ("Started run ID (NAME) in the background")."""
        return "in the background"

    def refresh(self, record: RunRecord) -> RunRecord:
        """The run as it is now, for a follow; may raise MlbenchError when the launcher cannot
        tell right now (:attr:`unreachable_seconds` says how long that is borne)."""
        return self.reconcile(self.store.get(record.id))

    def follow(self, record: RunRecord, on_event: EventCallback | None = None,
               refresh: Callable[[RunRecord], RunRecord] | None = None, interval: float | None = None,
               sleep: Callable[[float], None] = time.sleep) -> RunRecord:
        """Pass rank 0's events to ``on_event``, those recorded so far and then new ones as they
        arrive, until the run has ended; returns its final record. Of a resumed run, the events
        since its latest resume only (the earlier segments' lines were printed when they ran;
        `status RUN` summarizes the whole run). Every ``interval`` seconds
        (:attr:`follow_seconds`) ``refresh`` (:meth:`refresh`) says how the run is. The state is
        read *before* the events, so once a run is seen ended, the read that follows holds
        everything it wrote. With ``--log-to`` targets (:attr:`LaunchSettings.log_to`), a run
        followed with ``on_event`` (its own start, not `status --follow`) is written into them
        at every look (:class:`LiveExport`)."""
        look = refresh or self.refresh
        tail = EventTail(events_path(record.run_dir, 0), resumed_events_offset(record))
        export = (LiveExport(self.settings.log_to, record, self.settings.progress)
                  if self.settings.log_to and on_event is not None else None)
        misses = 0
        while True:
            ended = not record.active
            if on_event is not None:
                for event in tail.read_new():
                    on_event(event)
            if export is not None:
                if ended:
                    export.close(record)
                else:
                    export.poll()
            if ended:
                return record
            sleep(self.follow_seconds if interval is None else interval)
            try:
                record = look(record)
                misses = 0
            except MlbenchError:
                misses += 1
                if misses * self.follow_seconds > self.unreachable_seconds:
                    raise
                record = self.store.get(record.id)

    def logs(self, record: RunRecord, rank: int, follow: bool = False) -> Iterator[str]:
        """The output of worker ``rank``, line by line; with ``follow``, new lines as they are
        written, until the run ends. By default from ``RUN_DIR/logs/rank-R.log``, where local
        workers write and a cluster's supervisor keeps the logs of ended pods."""
        check_rank(record, rank)
        return follow_file(record, log_path(record.run_dir, rank), follow, self.refresh, self.follow_seconds)


#: A resume's entry in run.json: the size of rank 0's events file when the resume began, where
#: the resumed run's own events start.
EVENTS_FROM = "events_from"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def reopen_from_checkpoint(store: RunStore, record: RunRecord, max_steps: int | None = None,
                           before_resume: Callable[[RunRecord], None] | None = None) -> RunRecord:
    """Make an ended run of ``store`` ready to go on from its newest complete checkpoint: run.json
    names the checkpoint (``resume_step``) and records the resume (from which step, when, its step
    cap), and the run is pending again under the same id. ``max_steps``: the new step cap
    (:data:`NO_STEP_CAP`: none); None keeps the run's own, which must lie past the checkpoint.
    ``before_resume`` clears what the last start left outside the folder. Where the run folder
    and the checkpoints are: the CLI's machine for a local or Slurm run, the results service for
    a cluster's (its ``/resume`` endpoint). One UsageError line for a run that cannot resume,
    before anything changes: among them a run whose run.json no longer says what the run was
    created to compute (:func:`check_as_created`). Two resumes of one run at once are taken one
    at a time (:func:`resuming`): the second sees the run pending again and changes nothing."""
    with resuming(record.run_dir):
        return _reopen(store, store.get(record.id), max_steps, before_resume)


@contextlib.contextmanager
def resuming(run_dir: Path) -> Iterator[None]:
    """Hold the run folder's resume lock (an ``flock`` on the folder itself, so that no file is
    added to it): the check that a run has ended, run.json's edit and the catalog's reopening
    happen for one resume at a time, so a second `mlbench resume` of the same run neither writes
    its step cap into run.json nor clears the first one's heartbeats, and is refused in one line."""
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _reopen(store: RunStore, record: RunRecord, max_steps: int | None,
            before_resume: Callable[[RunRecord], None] | None) -> RunRecord:
    if record.active:
        raise UsageError(f"run {record.id} is {record.state}: resume continues a run that stopped, failed "
                         "or was cancelled")
    document = RunDocument.load_or_none(record.run_dir)
    if document is None:
        raise UsageError(f"run {record.id} has no readable run.json to resume from")
    check_as_created(store, record, document)
    config = document.config
    # config.workers: the group's size now (smaller than the store's after --on-failure shrink)
    root = checkpoint_root(record.run_dir, config.checkpoint_dir)
    if complete_checkpoints(root, config.workers).newest is None:
        hint = ("" if config.checkpoints else
                " (it was started without --checkpoint-every)")
        raise UsageError(f"run {record.id} has no complete checkpoint to resume from{hint}")
    verified = newest_valid(root, config.workers)
    newest, rejected = verified
    if newest is None:
        raise UsageError(f"run {record.id} has no valid checkpoint to resume from: {rejected[-1].line(root)}")
    cap = config.max_steps if max_steps is None else (None if max_steps == NO_STEP_CAP else max_steps)
    # killed after its last step's checkpoint, in the final evaluation: it resumes to its result
    unfinished = cap == newest and record.result is None and record.state != FINISHED
    if cap is not None and cap <= newest and not unfinished:
        raise UsageError(f"run {record.id}'s newest valid checkpoint is at step {newest}, its step cap "
                         f"{cap}: give a larger --max-steps (or --max-steps off)")
    if before_resume is not None:
        before_resume(record)
    document = RunDocument.load(record.run_dir)   # as before_resume left it
    # the processes of the last start are long gone (the run ended): nothing writes there
    newest = back_to_newest_checkpoint(record.run_dir, document, config.workers, verified)
    document.config.max_steps = cap
    # the start that ended: its wall time counts in the run's (mlbench.results.goodput)
    document.resumes.append({"from_step": newest, "at": time.time(), "max_steps": cap,
                             "after": record.state, "reason": record.reason,
                             "ended_start": {"started_at": record.started_at, "finished_at": record.finished_at},
                             EVENTS_FROM: _size(events_path(record.run_dir, 0))})
    document.save(record.run_dir)
    if not store.reopen(record.id):
        raise UsageError(f"run {record.id} started again meanwhile; not resumed")
    return store.get(record.id)


#: How many of the differences a refused resume names.
SHOWN_CHANGES = 3


def check_as_created(store: RunStore, record: RunRecord, document: RunDocument) -> None:
    """Refuse (one UsageError line naming what differs) to resume a run whose run.json was
    edited since the run was created: a resume goes on from a checkpoint of the run as it was
    recorded, and a changed batch size, task or optimizer would finish as one run what are two.
    The comparison is with the configuration the catalog froze at creation
    (:meth:`RunStore.frozen`), leaving out what mlbench itself rewrites
    (:func:`~mlbench.launch.run_folder.changes_since_created`); a run created before the catalog
    kept it resumes unchecked, as it did then."""
    frozen = store.frozen(record.id)
    if frozen is None:
        return
    changes = changes_since_created(frozen, document.to_dict())
    if not changes:
        return
    shown = "; ".join(changes[:SHOWN_CHANGES])
    if len(changes) > SHOWN_CHANGES:
        shown += f"; and {len(changes) - SHOWN_CHANGES} more"
    raise UsageError(f"run {record.id}: run.json changed since the run was created ({shown}); resume "
                     "continues the run as it was recorded")


def resumed_events_offset(record: RunRecord) -> int:
    """Where rank 0's events of the run's latest resume begin in its file (0: a run never
    resumed, or resumed before this was recorded)."""
    document = RunDocument.load_or_none(record.run_dir)
    resumes = document.resumes if document is not None else []
    offset = resumes[-1].get(EVENTS_FROM) if resumes else None
    return offset if isinstance(offset, int) and offset >= 0 else 0

"""Runs on this machine: the workers are processes here, supervised to the end.

The supervisor (:mod:`mlbench.launch.supervisor`) runs in the process of `mlbench run` (attached)
or in a background process of its own (``--detach``: forked from `mlbench run`, or a fresh
``python -m mlbench.launch.local HOME RUN_ID`` where that process may not fork); the store
records its pid and the run folder its start time, so that a cancel from any other process can
ask it to stop (SIGTERM) and a run whose supervisor died is seen as failed the next time
anything looks. ``--backend mpi`` runs start one ``mpirun`` in place of one
process per worker (:mod:`mlbench.launch.mpi`) and are otherwise local runs.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from typing import Any

from mlbench.errors import UsageError
from mlbench.frameworks import FRAMEWORKS, get_framework
from mlbench.launch.base import EventCallback, Launcher
from mlbench.launch.mpi import MpiProcesses, uses_mpirun
from mlbench.launch.faults import POLICIES
from mlbench.launch.forked import fork_process, may_fork
from mlbench.launch.plan import LauncherAbilities, RunRequest, WorkerResources
from mlbench.launch.run_folder import logs_dir
from mlbench.launch.supervisor import (
    CANCELLED_BY_USER,
    POLL_SECONDS,
    Cancelled,
    WorkerProcesses,
    kill_recorded_processes,
    record_supervisor,
    supervisor_of,
)
from mlbench.network.settings import NetworkSettings
from mlbench.results.faults import KINDS
from mlbench.results.store import CANCELLED, FAILED, FINISHED, RunRecord, RunStore
from mlbench.safefile import open_append

#: Local workers per usable core, and the memory one needs at least (a PyTorch process with a
#: small model), bounding how many this machine is asked to start.
WORKERS_PER_CORE = 16
WORKER_MEMORY_BYTES = 250 * 2**20
#: Threads (Linux counts each against the process limit) one worker starts, about.
THREADS_PER_WORKER = 32
CANCEL_WAIT_SECONDS = 10.0


def local_worker_limit() -> tuple[int, str]:
    """How many workers this machine can start, and what bounds it: cores, memory and the
    per-user process limit (a worker count past them forks until the system refuses)."""
    import resource

    from mlbench.results.environment import usable_cores

    cores = usable_cores()
    limits = [(max(32, WORKERS_PER_CORE * cores),
               f"{WORKERS_PER_CORE} per usable CPU core, of which it has {cores}")]
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        limits.append((max(1, memory // WORKER_MEMORY_BYTES),
                       f"{WORKER_MEMORY_BYTES >> 20} MB of its {memory / 2**30:.0f} GiB of memory each"))
    except (ValueError, OSError, AttributeError):
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY:
        limits.append((max(1, soft // THREADS_PER_WORKER),
                       f"the process limit (ulimit -u) of {soft}, about {THREADS_PER_WORKER} threads per worker"))
    return min(limits)


def _raise_cancelled(signum: int, frame: Any) -> None:
    raise Cancelled()


#: The entry point of a detached supervisor (:func:`_main`), also its forked copy's ``sys.argv``.
_DETACHED_MODULE = "mlbench.launch.local"


class LocalLauncher(Launcher):
    """Runs on this machine: one process per worker (or one mpirun), supervised by this process
    (attached) or by a background supervisor process (detached)."""

    name = "local"
    label = "local"
    on_this_machine = True
    resumable = True
    abilities = LauncherAbilities(frameworks=tuple(FRAMEWORKS), peer_addresses=True, fault_kinds=KINDS,
                                  policies=POLICIES)

    def check_workers(self, workers: int) -> None:
        limit, why = local_worker_limit()
        if workers > limit:
            raise UsageError(f"{workers} workers: this machine can start at most {limit} ({why}); "
                             "run more on a cluster (`mlbench set-cluster NAME`)", option="workers")

    def occupied_nodes(self, request: RunRequest, resources: WorkerResources | None) -> int:
        """This machine, which every worker shares."""
        return 1

    def network_record(self, settings: NetworkSettings) -> dict[str, Any]:
        from mlbench.network.emulation import check_local_shaping

        return check_local_shaping(settings)

    def create(self, request: RunRequest) -> RunRecord:
        self.check_workers(request.workers)
        framework = get_framework(request.framework)
        if framework.listens_everywhere and request.workers > 1 and request.network is None:
            from mlbench.network.emulation import private_loopback_problem

            problem = private_loopback_problem()
            if problem:
                raise UsageError(f"--framework {framework.name} on {request.workers} workers: {framework.title}'s "
                                 "servers listen on every interface, so its local workers run in a network "
                                 f"namespace of their own, which this machine cannot make: {problem}; "
                                 "or run one worker", option="framework")
        if request.data_pvc:
            raise UsageError("--data-pvc is for runs on a cluster; use --data-dir DIR on this machine")
        return self.record(request)

    def run_attached(self, record: RunRecord, on_event: EventCallback | None = None) -> RunRecord:
        """Start the run's workers here and supervise them to the end (Ctrl-C / SIGTERM cancel)."""
        previous = signal.signal(signal.SIGTERM, _raise_cancelled)
        processes = (MpiProcesses if uses_mpirun(record.run_dir) else WorkerProcesses)(self.store, record)
        try:
            try:
                processes.start()
            except (KeyboardInterrupt, Cancelled):
                self.store.mark_ended(record.id, CANCELLED, reason=CANCELLED_BY_USER)
                return self.store.get(record.id)
            except BaseException as err:  # e.g. no process could be started: not pending forever
                self.store.mark_ended(record.id, FAILED, reason=f"the workers could not be started: {err}")
                raise
            try:
                return self.follow(self.store.get(record.id), on_event, refresh=processes.poll,
                                   interval=POLL_SECONDS)
            except (KeyboardInterrupt, Cancelled) as err:
                return processes.end(err)
            except BaseException as err:
                processes.end(err)
                raise
        finally:
            signal.signal(signal.SIGTERM, previous)

    def start_detached(self, record: RunRecord) -> None:
        """Supervise the run from a background process that outlives this one: forked from this
        process where it may fork (:func:`mlbench.launch.forked.may_fork`: no interpreter to start,
        nothing imported twice, and the supervisor still forks its ranks; this process does not
        import torch for it, so that `run --detach` returns at once), else a fresh
        ``python -m mlbench.launch.local HOME RUN_ID``."""
        log = logs_dir(record.run_dir) / "supervisor.log"
        args = [str(self.store.home), record.id]
        if may_fork():
            pid = fork_process(functools.partial(_main, args), _DETACHED_MODULE, args, "mlbench-superv", log,
                               dict(os.environ)).pid
        else:
            opened = open_append(log)  # mode 600; closed below, after the fork
            try:
                pid = subprocess.Popen([sys.executable, "-m", _DETACHED_MODULE, *args],
                                       stdout=opened, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True).pid
            finally:
                opened.close()
        record_supervisor(record.run_dir, pid)  # our child: surely the process meant
        self.store.update(record.id, supervisor_pid=pid)

    def cancel(self, record: RunRecord) -> RunRecord:
        """Stop an active run: ask its supervisor, or end orphaned workers directly. Only
        processes that are still the ones recorded are signalled (a reused pid is left alone)."""
        supervisor = supervisor_of(record)
        if supervisor is not None and supervisor.pid != os.getpid() and supervisor.signal(signal.SIGTERM):
            deadline = time.monotonic() + CANCEL_WAIT_SECONDS
            while time.monotonic() < deadline and self.store.get(record.id).active:
                time.sleep(POLL_SECONDS)
        kill_recorded_processes(record.run_dir)
        if self.store.get(record.id).active:
            self.store.mark_ended(record.id, CANCELLED, reason=CANCELLED_BY_USER)
        return self.store.get(record.id)

    def reconcile(self, record: RunRecord) -> RunRecord:
        """A run still marked active whose supervisor is gone ended without saying so: say it. A
        supervisor pid that now names another process (the pid was reused) counts as gone."""
        supervisor = supervisor_of(record) if record.active else None
        if supervisor is not None and not supervisor.alive():
            kill_recorded_processes(record.run_dir)
            self.store.mark_ended(record.id, FAILED, reason=f"its supervising process (pid "
                                                            f"{record.supervisor_pid}) ended unexpectedly")
            return self.store.get(record.id)
        return record


def _main(argv: list[str]) -> int:
    """Entry point of a detached supervisor: ``python -m mlbench.launch.local HOME RUN_ID``."""
    store = RunStore(argv[0])
    run = store.get(argv[1])
    store.update(run.id, supervisor_pid=os.getpid())
    final = LocalLauncher(store).run_attached(run)
    return 0 if final.state == FINISHED else 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

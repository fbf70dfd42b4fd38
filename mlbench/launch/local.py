"""Run a benchmark's workers as processes on this machine, and watch them to the end.

The supervisor (this module) binds the rendezvous socket to 127.0.0.1 on a port the OS picks,
starts ``python -m mlbench.worker RUN_DIR --rank r`` for every rank, each in its own session (so
a Ctrl-C at the terminal reaches the supervisor only) and tied to the supervisor's life
(PR_SET_PDEATHSIG), and polls them. One worker failing ends the others and marks the run failed
with that worker's reason; Ctrl-C or SIGTERM ends them and marks it cancelled; every worker exits
within seconds either way, and whatever was recorded stays in the run folder.

A run with a ``network`` in run.json (``--bandwidth``/``--latency``, :mod:`mlbench.network`) is
started on an emulated network instead: the supervisor first starts the process that holds the
run's network namespaces (tied to it like the workers, recorded in pids.json), every worker
runs inside its own namespace, rank 0 listens for the rendezvous on its namespace address and
gloo uses the namespace's link; the namespaces end with that process and the workers.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

from mlbench.errors import UsageError
from mlbench.launch.base import EventCallback, Launcher
from mlbench.launch.plan import RunRequest, create_run
from mlbench.launch.processes import ProcessRef
from mlbench.network.emulation import NETWORK_LOST, LocalNetwork, local_network
from mlbench.results.events import EventTail, read_rank_events
from mlbench.run_config import RunDocument
from mlbench.results.store import (
    CANCELLED,
    FAILED,
    FINISHED,
    RunRecord,
    RunStore,
    read_json,
    write_json_atomic,
)

POLL_SECONDS = 0.1
TERMINATE_GRACE_SECONDS = 4.0
PIDS_FILE = "pids.json"
#: The supervising process of a run as [pid, start time] (:mod:`mlbench.launch.processes`).
SUPERVISOR_FILE = "supervisor.json"

ProgressCallback = Callable[[dict[str, Any]], None]


class Cancelled(Exception):
    """The supervisor was asked to stop (Ctrl-C, SIGTERM)."""


def _set_pdeathsig(parent: int) -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the worker gets SIGKILL if the supervisor dies, so no worker is ever orphaned.

    A supervisor that died between the fork and the prctl would not be noticed, so the child
    checks afterwards that its parent is still the supervisor.
    """
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != parent:
        os._exit(1)


def _loopback_interface() -> str | None:
    for _, name in socket.if_nameindex():
        if name in ("lo", "lo0"):
            return name
    return None


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _last_error(run_dir: Path, rank: int) -> str | None:
    errors = [e for e in read_rank_events(run_dir / "events" / f"rank-{rank}.jsonl")
              if e["name"] == "error"]
    return str(errors[-1]["value"]) if errors else None


def _log_tail(run_dir: Path, rank: int, lines: int = 1) -> str | None:
    try:
        text = (run_dir / "logs" / f"rank-{rank}.log").read_text(errors="replace").strip()
    except OSError:
        return None
    tail = [line for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(tail) if tail else None


class WorkerProcesses:
    """Starts and supervises the worker processes of one run."""

    def __init__(self, store: RunStore, run: RunRecord):
        self.store = store
        self.run = run
        self.run_dir = run.run_dir
        self.procs: list[subprocess.Popen] = []
        self.network: LocalNetwork | None = None

    def start(self) -> None:
        document = RunDocument.load(self.run_dir)
        config = document.config
        pdeathsig = (functools.partial(_set_pdeathsig, os.getpid())
                     if sys.platform.startswith("linux") else None)
        env = dict(os.environ)
        threads = str(config.threads_per_worker)
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PYTHONUNBUFFERED="1")
        listener = None
        try:
            # an emulated network: every worker in its own namespace, rendezvous on rank 0's address
            self.network = local_network(document.to_dict(), self.run_dir / "logs" / "network.log", pdeathsig)
            if self.network:
                config.master_addr, config.master_port = self.network.master_addr, self.network.master_port
            else:
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                listener.bind(("127.0.0.1", 0))
                listener.listen(config.workers * 2)
                config.master_addr, config.master_port = "127.0.0.1", listener.getsockname()[1]
                loopback = _loopback_interface()
                if loopback:
                    env["GLOO_SOCKET_IFNAME"] = loopback  # gloo's own sockets stay on this machine too
            document.save(self.run_dir)
            for rank in range(config.workers):
                cmd = [sys.executable, "-m", "mlbench.worker", str(self.run_dir), "--rank", str(rank)]
                pass_fds: tuple[int, ...] = ()
                rank_env = env
                if self.network:
                    cmd, rank_env = self.network.worker_command(rank, cmd), {**env, **self.network.worker_env(rank)}
                elif rank == 0 and listener is not None:
                    cmd += ["--store-fd", str(listener.fileno())]
                    pass_fds = (listener.fileno(),)
                self.procs.append(self.spawn(cmd, f"rank-{rank}.log", rank_env, pass_fds))
        except BaseException:
            self.stop_all()
            raise
        finally:
            if listener:
                listener.close()
        record_pids(self.run_dir, [p.pid for p in self.procs], self.network.pid if self.network else None)
        mark_supervised(self.store, self.run)

    def spawn(self, cmd: list[str], log_name: str, env: dict[str, str],
              pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
        """One process in its own session, logging to ``logs/LOG_NAME``, tied to our life."""
        with open(self.run_dir / "logs" / log_name, "ab") as log:
            return subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, pass_fds=pass_fds, start_new_session=True,
                preexec_fn=(functools.partial(_set_pdeathsig, os.getpid())
                            if sys.platform.startswith("linux") else None))

    def failure_reason(self, index: int, code: int) -> str:
        """Why the run failed, given the process (a worker's rank) that exited first."""
        reason = f"worker {index} {describe_exit(code)}"
        detail = _last_error(self.run_dir, index) or _log_tail(self.run_dir, index)
        return f"{reason}: {detail}" if detail else reason

    def stop_all(self) -> None:
        """SIGTERM every worker's process group, then SIGKILL what is left after a grace period."""
        alive = [p for p in self.procs if p.poll() is None]
        for proc in alive:
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + TERMINATE_GRACE_SECONDS
        while alive and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
            alive = [p for p in alive if p.poll() is None]
        for proc in alive:
            _signal_group(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self.network:
            self.network.stop()

    def supervise(self, on_event: ProgressCallback | None = None) -> RunRecord:
        """Wait for the workers; record how the run ended; return its final record."""
        tail = EventTail(self.run_dir / "events" / "rank-0.jsonl")
        try:
            while True:
                if on_event:
                    for event in tail.read_new():
                        on_event(event)
                codes = [p.poll() for p in self.procs]
                failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
                if failed:
                    # a worker killed by a signal is the cause; the others' connection errors
                    # are its consequence, even when they are seen in the same poll
                    rank, code = min(failed, key=lambda rank_code: (rank_code[1] >= 0, rank_code[0]))
                    self.stop_all()
                    self.store.mark_ended(self.run.id, FAILED, reason=self.failure_reason(rank, code))
                    break
                if all(c == 0 for c in codes):
                    if on_event:
                        for event in tail.read_new():
                            on_event(event)
                    self.stop_all()  # nothing left to stop but the emulated network
                    self._finish()
                    break
                if self.network and not self.network.alive():
                    self.stop_all()
                    self.store.mark_ended(self.run.id, FAILED, reason=NETWORK_LOST)
                    break
                time.sleep(POLL_SECONDS)
        except (KeyboardInterrupt, Cancelled):
            self.stop_all()
            self.store.mark_ended(self.run.id, CANCELLED, reason="cancelled by the user")
        except BaseException as err:
            self.stop_all()
            self.store.mark_ended(self.run.id, FAILED, reason=f"supervisor error: {err}")
            raise
        return self.store.get(self.run.id)

    def _finish(self) -> None:
        results = [e for e in read_rank_events(self.run_dir / "events" / "rank-0.jsonl")
                   if e["name"] == "result"]
        if results:
            self.store.mark_ended(self.run.id, FINISHED, result=results[-1]["value"])
        else:
            self.store.mark_ended(self.run.id, FAILED, reason="the workers exited without a result")


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def record_pids(run_dir: Path, workers: list[int], network: int | None = None) -> None:
    """pids.json: the worker processes (and the network's holder) as pids, with each one's start
    time under "identity", so that a later look never takes a reused pid for them."""
    pids = [*workers, *([network] if network else []), os.getpid()]
    write_json_atomic(run_dir / PIDS_FILE, {
        "supervisor": os.getpid(), "workers": workers, "network": network,
        "identity": {str(pid): ProcessRef.of(pid).started for pid in pids}})


def recorded_processes(run_dir: Path) -> list[ProcessRef]:
    """The run's worker processes and network holder as pids.json names them."""
    try:
        recorded = read_json(run_dir / PIDS_FILE)
        identity = recorded.get("identity") or {}
        pids = [*recorded.get("workers", []), *[pid for pid in [recorded.get("network")] if pid]]
        refs = [ProcessRef.from_json([pid, identity.get(str(pid))]) for pid in pids]
    except (OSError, ValueError, TypeError, AttributeError):
        return []
    return [ref for ref in refs if ref is not None]


def mark_supervised(store: RunStore, run: RunRecord) -> None:
    """This process supervises ``run`` from now: recorded in the store and, with its start time,
    in the run folder."""
    record_supervisor(run.run_dir, os.getpid())
    store.mark_running(run.id, os.getpid())


def record_supervisor(run_dir: Path, pid: int) -> None:
    write_json_atomic(run_dir / SUPERVISOR_FILE, ProcessRef.of(pid).to_json())


def supervisor_of(run: RunRecord) -> ProcessRef | None:
    """The run's supervising process: the store's pid, with the start time the run folder
    recorded for it (none recorded, or for another pid: the pid alone)."""
    if not run.supervisor_pid:
        return None
    try:
        recorded = ProcessRef.from_json(read_json(run.run_dir / SUPERVISOR_FILE))
    except (OSError, ValueError):
        recorded = None
    if recorded is not None and recorded.pid == run.supervisor_pid:
        return recorded
    return ProcessRef(run.supervisor_pid)


def _raise_cancelled(signum, frame) -> None:
    raise Cancelled()


def run_local(store: RunStore, run: RunRecord, on_event: ProgressCallback | None = None) -> RunRecord:
    """Start the run's workers here and supervise them to the end (Ctrl-C / SIGTERM cancel)."""
    previous = signal.signal(signal.SIGTERM, _raise_cancelled)
    from mlbench.launch.mpi import MpiLauncher, uses_mpirun  # --backend mpi: mpirun's ranks

    launcher = (MpiLauncher if uses_mpirun(run.run_dir) else WorkerProcesses)(store, run)
    try:
        try:
            launcher.start()
        except (KeyboardInterrupt, Cancelled):
            store.mark_ended(run.id, CANCELLED, reason="cancelled by the user")
            return store.get(run.id)
        except BaseException as err:  # e.g. no process could be started: not pending forever
            store.mark_ended(run.id, FAILED, reason=f"the workers could not be started: {err}")
            raise
        return launcher.supervise(on_event)
    finally:
        signal.signal(signal.SIGTERM, previous)


def start_detached(store: RunStore, run: RunRecord) -> int:
    """Supervise the run from a background process that outlives this one; returns its pid."""
    log = open(run.run_dir / "logs" / "supervisor.log", "ab")  # noqa: SIM115 - closed below, after the fork
    try:
        proc = subprocess.Popen([sys.executable, "-m", "mlbench.launch.local", str(store.home), run.id],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    finally:
        log.close()
    record_supervisor(run.run_dir, proc.pid)  # our child: surely the process meant
    store.update(run.id, supervisor_pid=proc.pid)
    return proc.pid


def pid_alive(pid: int | None) -> bool:
    """Whether a process ``pid`` (of unknown start time) exists and is not a zombie."""
    return pid is not None and pid != 0 and ProcessRef(pid).alive()


def cancel(store: RunStore, run: RunRecord, timeout: float = 10.0) -> RunRecord:
    """Stop an active run: ask its supervisor, or end orphaned workers directly. Only processes
    that are still the ones recorded are signalled (a reused pid is left alone)."""
    supervisor = supervisor_of(run)
    if supervisor is not None and supervisor.pid != os.getpid() and supervisor.signal(signal.SIGTERM):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and store.get(run.id).active:
            time.sleep(POLL_SECONDS)
    _kill_recorded_workers(run.run_dir)
    run = store.get(run.id)
    if run.active:
        store.mark_ended(run.id, CANCELLED, reason="cancelled by the user")
    return store.get(run.id)


def _kill_recorded_workers(run_dir: Path) -> None:
    # the emulated network's holder too: its namespaces go with it and the workers
    for process in recorded_processes(run_dir):
        process.signal_group(signal.SIGKILL)


def reconcile(store: RunStore, run: RunRecord) -> RunRecord:
    """A run still marked active whose supervisor is gone ended without saying so: say it. A
    supervisor pid that now names another process (the pid was reused) counts as gone."""
    supervisor = supervisor_of(run) if run.active and run.launcher == "local" else None
    if supervisor is not None and not supervisor.alive():
        _kill_recorded_workers(run.run_dir)
        store.mark_ended(run.id, FAILED, reason=f"its supervising process (pid {run.supervisor_pid}) "
                                                 "ended unexpectedly")
        return store.get(run.id)
    return run


#: Local workers per usable core, and the memory one needs at least (a PyTorch process with a
#: small model), bounding how many this machine is asked to start.
WORKERS_PER_CORE = 16
WORKER_MEMORY_BYTES = 250 * 2**20
#: Threads (Linux counts each against the process limit) one worker starts, about.
THREADS_PER_WORKER = 32


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


def _main(argv: list[str]) -> int:
    """Entry point of a detached supervisor: ``python -m mlbench.launch.local HOME RUN_ID``."""
    store = RunStore(argv[0])
    run = store.get(argv[1])
    store.update(run.id, supervisor_pid=os.getpid())
    final = run_local(store, run)
    return 0 if final.state == FINISHED else 1


class LocalLauncher(Launcher):
    """Runs on this machine: one process per worker, supervised by this process (attached) or by
    a background supervisor process (detached)."""

    name = "local"

    def check_workers(self, workers: int) -> None:
        limit, why = local_worker_limit()
        if workers > limit:
            raise UsageError(f"{workers} workers: this machine can start at most {limit} ({why}); "
                             "run more on a cluster (`mlbench set-cluster NAME`)")

    def create(self, request: RunRequest) -> RunRecord:
        self.check_workers(request.workers)
        if request.data_pvc:
            raise UsageError("--data-pvc is for runs on a cluster; use --data-dir DIR on this machine")
        return create_run(self.store, request, launcher=self.name)

    def run_attached(self, record: RunRecord, on_event: EventCallback | None = None) -> RunRecord:
        return run_local(self.store, record, on_event)

    def start_detached(self, record: RunRecord) -> None:
        start_detached(self.store, record)

    def cancel(self, record: RunRecord) -> RunRecord:
        return cancel(self.store, record)

    def reconcile(self, record: RunRecord) -> RunRecord:
        return reconcile(self.store, record)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

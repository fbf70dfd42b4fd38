"""The process supervisor of a run on this machine: starts its worker processes, watches them,
records how the run ended, and stops what is left.

It binds the rendezvous socket to 127.0.0.1 on a port the OS picks, starts ``python -m
mlbench.worker RUN_DIR --rank r`` for every rank, each in its own session (so a Ctrl-C at the
terminal reaches the supervisor only) and tied to the supervisor's life (PR_SET_PDEATHSIG). One
worker failing ends the others; what follows (the run failed with that worker's reason, or the
group restarted or shrunk under ``--on-failure``) is the recovery's decision
(:mod:`mlbench.launch.recovery`, shared with the Slurm and cluster supervisors). A cancel ends
them and marks the run cancelled; every worker exits within seconds either way, and whatever
was recorded stays in the run folder.

A run with a ``network`` in run.json (``--bandwidth``/``--latency``, :mod:`mlbench.network`) is
started on an emulated network instead: the supervisor first starts the process that holds the
run's network namespaces (tied to it like the workers, recorded in pids.json), every worker
runs inside its own namespace, rank 0 listens for the rendezvous on its namespace address and
gloo uses the namespace's link; the namespaces end with that process and the workers. The
workers of a framework whose servers listen on every interface (TensorFlow's gRPC servers) run
in one namespace held the same way, whose only interface is its loopback
(:class:`mlbench.network.emulation.PrivateLoopback`): nothing outside it can reach them.

Kept apart from the launchers so that the local launcher and its MPI process starter
(:mod:`mlbench.launch.mpi`) share it without importing each other.
"""

from __future__ import annotations

import ctypes
import functools
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Mapping, Sequence
from typing import Any

from mlbench.errors import MlbenchError, peer_consequence
from mlbench.frameworks import PYTORCH, get_framework
from mlbench.launch.forked import ForkedProcess, fork_worker, forking_allowed, may_fork, preload_port
from mlbench.launch.recovery import BACKING_OFF, Recovery
from mlbench.launch.processes import ProcessRef
from mlbench.launch.run_folder import events_path, log_path, log_tail, logs_dir, rank_error
from mlbench.network.emulation import LocalNetwork, PrivateLoopback, local_network
from mlbench.results.events import read_rank_events
from mlbench.results.faults import FAULT_CLOCK_ENV
from mlbench.results.heartbeat import read_beats
from mlbench.results.store import (
    CANCELLED,
    FAILED,
    FINISHED,
    RunRecord,
    RunStore,
    read_json,
    write_json_atomic,
)
from mlbench.results.watchdog import Stall, judge
from mlbench.run_config import RunConfig, RunDocument
from mlbench.safefile import open_append
from mlbench.tasks.registry import TASKS, runtime_module
from mlbench.worker.heartbeat import SUPERVISED_ENV
from mlbench.worker.launcher_env import PEERS_ENV

POLL_SECONDS = 0.1
#: Seconds between two looks at the workers' heartbeats.
WATCH_SECONDS = 1.0
TERMINATE_GRACE_SECONDS = 4.0
#: Seconds the survivors of a worker that died get to end by themselves before they are killed:
#: their collective fails as the peer's sockets close, and the error they record then is what
#: the timeline shows under the restart (docs/faults.md).
PEER_REPORT_SECONDS = 1.0
PIDS_FILE = "pids.json"
#: The supervising process of a run as [pid, start time] (:mod:`mlbench.launch.processes`).
SUPERVISOR_FILE = "supervisor.json"
CANCELLED_BY_USER = "cancelled by the user"


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


def tied_to_this_process() -> functools.partial[None] | None:
    """The preexec function that ties a child to this process's life (Linux only)."""
    return functools.partial(_set_pdeathsig, os.getpid()) if sys.platform.startswith("linux") else None


#: where :func:`free_ports` looks, below the kernel's ephemeral range
_UNASSIGNED_PORTS_FROM = 10000


def free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct ports free on ``host`` now (all held open until all are picked, so none
    repeats), which the workers bind themselves seconds later, once they have imported their
    framework (a JAX coordinator, TensorFlow's servers). They are drawn at random from *below*
    the kernel's ephemeral range (``net.ipv4.ip_local_port_range``): a port the OS handed out
    there (``bind`` to port 0) is the kind it gives any process's next outgoing connection, and
    one was taken so in that window (a JAX coordinator's bind failed on a loaded machine). Where
    the range cannot be read (not Linux), the OS picks, as before."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    candidates = random.sample(range(_UNASSIGNED_PORTS_FROM, low), low - _UNASSIGNED_PORTS_FROM) \
        if low > _UNASSIGNED_PORTS_FROM + count else [0] * count
    sockets: list[socket.socket] = []
    try:
        for port in candidates:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((host, port))
            except OSError:   # in use: the next one
                s.close()
                continue
            sockets.append(s)
            if len(sockets) == count:
                return [s.getsockname()[1] for s in sockets]
        raise MlbenchError(f"no {count} free TCP port(s) on {host} below {low}")
    finally:
        for s in sockets:
            s.close()


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


class WorkerProcesses:
    """Starts and supervises the worker processes of one run (one process per worker)."""

    def __init__(self, store: RunStore, run: RunRecord):
        self.store = store
        self.run = run
        self.run_dir = run.run_dir
        self.procs: list[subprocess.Popen | ForkedProcess] = []
        self.network: LocalNetwork | PrivateLoopback | None = None
        self.workers = run.workers
        self.watchdog_s: float | None = None
        self.started_at = time.time()
        self._watched_at = 0.0
        # --inject and --on-failure (mlbench.launch.recovery): made at the first start; the
        # fault clock starts with it and goes on through restarts
        self.recovery: Recovery | None = None

    def worker_env(self, config: RunConfig) -> dict[str, str]:
        """The workers' environment (their threads, and that this process watches them); the
        watchdog's bound and clock start here, as the workers do."""
        threads = str(config.threads_per_worker)
        self.watchdog_s, self.started_at = config.watchdog_s, time.time()
        return dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PYTHONUNBUFFERED="1",
                    **{SUPERVISED_ENV: "1"})

    def start(self, restarting: bool = False) -> None:
        """Start the workers (again, after a failure, with ``restarting``: the run stays marked
        running since its first start)."""
        document = RunDocument.load(self.run_dir)
        config = document.config
        env = self.worker_env(config)
        self.workers = config.workers   # the group's size now (smaller than the store's after a shrink)
        if self.recovery is None:
            self.recovery = Recovery(self.run_dir)
        listener = None
        framework = get_framework(config.framework)
        try:
            # an emulated network: every worker in its own namespace, rendezvous on rank 0's
            # address; TensorFlow's workers: one namespace with a loopback only (its gRPC servers
            # listen on every interface)
            self.network = local_network(document.to_dict(), logs_dir(self.run_dir) / "network.log",
                                         tied_to_this_process())
            if self.network:
                config.master_addr, config.master_port = self.network.master_addr, self.network.master_port
            elif framework is PYTORCH:   # rank 0's store takes over this listening socket: no race
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                listener.bind(("127.0.0.1", 0))
                listener.listen(config.workers * 2)
                config.master_addr, config.master_port = "127.0.0.1", listener.getsockname()[1]
            else:   # the port's coordinator binds it itself, after its framework's import
                config.master_addr, config.master_port = "127.0.0.1", free_ports("127.0.0.1", 1)[0]
            if not self.network:
                loopback = _loopback_interface()
                if loopback:
                    env["GLOO_SOCKET_IFNAME"] = loopback  # gloo's own sockets stay on this machine too
            document.save(self.run_dir)
            # the ranks are forked from here once their modules are imported (mlbench.launch.forked:
            # seconds of CPU saved per worker), and join their namespaces of an emulated network
            # themselves; a port to another framework is forked too (it uses torch for the data
            # and the initial weights), its framework imported here first (the import saved in
            # every rank; the ranks make every object of it); its coordinator binds the port itself
            fork = forking_allowed(TASKS.runtime_module(config.task.name))
            if fork and framework is not PYTORCH:
                fork = preload_port(framework.worker)
            prepare = (getattr(runtime_module(config.task), "prepare_before_fork", None)
                       if fork and framework is PYTORCH else None)
            if prepare is not None:   # what every rank would make alike (synthetic data, imports), made once
                prepare(config)
                fork = may_fork()     # (it starts no thread; if a library's version did, fresh ranks)
            self._start_fault_clock(config, env)
            if framework.peers and config.workers > 1:  # each worker's own address (TensorFlow)
                env[PEERS_ENV] = ",".join(f"{config.master_addr}:{port}"
                                          for port in free_ports(config.master_addr, config.workers))
            for rank in range(config.workers):
                worker_args = [str(self.run_dir), "--rank", str(rank)]
                pass_fds: tuple[int, ...] = ()
                rank_env = env
                if rank == 0 and listener is not None:
                    worker_args += ["--store-fd", str(listener.fileno())]
                    pass_fds = (listener.fileno(),)
                log = log_path(self.run_dir, rank)
                if fork:
                    network = self.network
                    enter = functools.partial(network.enter, rank) if network else None
                    rank_env = {**env, **network.worker_env(rank)} if network else env
                    self.procs.append(fork_worker(worker_args, log, rank_env, pass_fds, tied_to_this_process(),
                                                  enter, framework.worker))
                    continue
                cmd = [sys.executable, "-m", framework.worker, *worker_args]
                if self.network:
                    cmd, rank_env = self.network.worker_command(rank, cmd), {**env, **self.network.worker_env(rank)}
                self.procs.append(self.spawn(cmd, log.name, rank_env, pass_fds))
        except BaseException:
            self.stop_all()
            raise
        finally:
            if listener:
                listener.close()
        record_pids(self.run_dir, [p.pid for p in self.procs], self.network.pid if self.network else None)
        if not restarting:
            mark_supervised(self.store, self.run)

    def _start_fault_clock(self, config: RunConfig, env: dict[str, str]) -> None:
        """The fault clock starts as the workers of the first start do (the run's start; after
        ``mlbench resume``, it goes on from the seconds the stopped supervisor recorded); the
        workers learn it from their environment (a straggler's schedule)."""
        assert self.recovery is not None
        env[FAULT_CLOCK_ENV] = repr(self.recovery.start_clock())

    def spawn(self, cmd: list[str], log_name: str, env: dict[str, str],
              pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
        """One process in its own session, logging to ``logs/LOG_NAME``, tied to our life."""
        with open_append(logs_dir(self.run_dir) / log_name) as log:  # mode 600, never through a link
            return subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, pass_fds=pass_fds, start_new_session=True, preexec_fn=tied_to_this_process())

    def failure_reason(self, index: int, code: int) -> str:
        """Why the run failed, given the process (a worker's rank) that exited first."""
        reason = f"worker {index} {describe_exit(code)}"
        # this group's own words: an earlier group's recorded error is not why this one's died, nor
        # is the last line of its log (which goes on from the earlier group's) for a worker killed
        # by a signal after a restart
        record = self.recovery.record if self.recovery is not None else None
        restarted = record is not None and bool(record.restarts)
        detail = rank_error(self.run_dir, index, since=self.started_at) \
            or (log_tail(log_path(self.run_dir, index)) if code > 0 or not restarted else None)
        return f"{reason}: {detail}" if detail else reason

    def stop_all(self, grace: float = TERMINATE_GRACE_SECONDS) -> None:
        """SIGTERM every worker's process group, then SIGKILL what is left after ``grace`` seconds."""
        alive = [p for p in self.procs if p.poll() is None]
        for proc in alive:
            _signal_group(proc.pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
        deadline = time.monotonic() + grace
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

    def poll(self, run: RunRecord | None = None) -> RunRecord:
        """One look at the workers: a failed one, all of them done, or the emulated network gone
        ends the run (recorded in the store); returns the run's record either way. ``run`` is
        ignored (the signature of a launcher's refresh)."""
        recovery = self.recovery
        assert recovery is not None
        if recovery.state == BACKING_OFF:   # no group: its next one starts once the back-off is over
            recovery.tick([])
            self._start_when_due()
            return self.store.get(self.run.id)
        recovery.tick(self.procs, self.network)
        codes = [p.poll() for p in self.procs]
        failed = {r: c for r, c in enumerate(codes) if c not in (None, 0)}
        if failed:
            causes = self.causes(failed)
            self.failed(causes, "; ".join(self.failure_reason(rank, failed[rank]) for rank in causes), failed)
        elif all(c == 0 for c in codes):
            self.stop_all()  # nothing left to stop but the emulated network
            self._finish()
        elif self.network and not self.network.alive():
            self.stop_all()
            self._mark_ended(FAILED, reason=self.network.lost)
        elif (stall := self.watch(codes)) is not None:
            self.failed(stall.ranks, stall.reason)  # SIGKILL reaches a stopped process too
        return self.store.get(self.run.id)

    def _start_when_due(self) -> None:
        """Start the next group once the recovery's back-off is over."""
        assert self.recovery is not None
        if self.recovery.may_start():
            self.start(restarting=True)
            self.recovery.started()

    def causes(self, failed: dict[int, int]) -> list[int]:
        """The ranks whose exit is a failure of their own, among those that exited with ``failed``
        codes: every worker killed by a signal (several killed at once are one failure); without
        one, every rank whose recorded error is its own, not a peer's closed connection; else the
        lowest rank. The others' connection errors are their consequence, even when they are
        seen in the same poll."""
        killed = [rank for rank, code in failed.items() if code < 0]
        own = [rank for rank in failed
               if not peer_consequence(rank_error(self.run_dir, rank, since=self.started_at) or "")]
        return sorted(killed or own or [min(failed)])

    def failed(self, ranks: Sequence[int], reason: str, codes: Mapping[int, int | None] | None = None) -> None:
        """Workers ``ranks`` died or stalled: what ``--on-failure`` does is the recovery's
        decision (:meth:`mlbench.launch.recovery.Recovery.failure`): restart the group or go on
        with the survivors, from the newest valid checkpoint, once its back-off is over; or end
        the run failed, naming the injected faults it is put down to."""
        assert self.recovery is not None
        decision = self.recovery.failure(ranks, reason, codes=codes)
        if codes is not None:
            self.let_survivors_report()
        if decision.goes_on:
            self.stop_all(grace=0)   # the checkpoint is what goes on; nothing to save
            entry = self.recovery.group_ended()
            print(f"mlbench: {self.recovery.line(entry)}", file=sys.stderr, flush=True)
            self.procs = []
            self._start_when_due()
            return
        self.stop_all(grace=0 if decision.faults else TERMINATE_GRACE_SECONDS)
        self._mark_ended(FAILED, reason=decision.reason + decision.given_up)

    def let_survivors_report(self, seconds: float = PEER_REPORT_SECONDS) -> None:
        """Wait up to ``seconds`` for the workers still running after a peer exited to end by
        themselves, so that each records the error its failed collective raised (a peer's
        closed connection) instead of being killed before it could. A stalled group is not
        waited for: its survivors block until their collective's timeout."""
        deadline = time.monotonic() + seconds
        while any(p.poll() is None for p in self.procs) and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS / 4)

    def watch(self, codes: list[int | None]) -> Stall | None:
        """The watchdog's verdict on the workers' heartbeats (:mod:`mlbench.results.watchdog`),
        looked at about once a second; None while no rank stalled or without a watchdog."""
        now = time.time()
        if not self.watchdog_s or now - self._watched_at < WATCH_SECONDS:
            return None
        self._watched_at = now
        exited = {rank for rank, code in enumerate(codes) if code is not None} if len(codes) == self.workers else set()
        return judge(read_beats(self.run_dir, self.workers), now, self.watchdog_s, self.started_at, exited)

    def end(self, how: BaseException) -> RunRecord:
        """The supervision was interrupted by ``how``: a cancel ends the run as cancelled, any
        other error as failed (the workers are stopped either way)."""
        self.stop_all()
        if isinstance(how, (KeyboardInterrupt, Cancelled)):
            self._mark_ended(CANCELLED, reason=CANCELLED_BY_USER)
        else:
            self._mark_ended(FAILED, reason=f"supervisor error: {how}")
        return self.store.get(self.run.id)

    def _mark_ended(self, state: str, **details: Any) -> None:
        """End the run in the store, first recording in run.json the seconds its fault clock ran,
        which a resume goes on from (docs/faults.md)."""
        if self.recovery is not None:
            self.recovery.save_clock()
        self.store.mark_ended(self.run.id, state, **details)

    def _finish(self) -> None:
        results = [e for e in read_rank_events(events_path(self.run_dir, 0)) if e["name"] == "result"]
        if results:
            self._mark_ended(FINISHED, result=results[-1]["value"])
        else:
            self._mark_ended(FAILED, reason="the workers exited without a result")


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


def kill_recorded_processes(run_dir: Path) -> None:
    """SIGKILL the recorded workers (and the emulated network's holder: its namespaces go with
    it) that are still the processes recorded."""
    for process in recorded_processes(run_dir):
        process.signal_group(signal.SIGKILL)


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


def pid_alive(pid: int | None) -> bool:
    """Whether a process ``pid`` (of unknown start time) exists and is not a zombie."""
    return pid is not None and pid != 0 and ProcessRef(pid).alive()

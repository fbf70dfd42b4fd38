"""Worker processes forked from a supervisor that imported torch once.

A fresh ``python -m mlbench.worker`` spends 3-5 CPU seconds importing torch and the task's
modules before its first step; a run of k local workers paid that k times over, which on a
2-core laptop (or CI box) was most of a short run's cost. The local supervisor instead imports
the worker's modules once and forks each rank from itself, as PyTorch's DataLoader and
multiprocessing's forkserver do: the ranks share the imported pages copy-on-write and start in
milliseconds. Each child is then made to look like the process ``subprocess.Popen`` would have
started: its own session, stdin from /dev/null, stdout and stderr to its log file, the rank's
environment, no descriptor of the parent's except those passed on purpose, and tied to the
supervisor's life.

Forking is only safe from a process with one thread, no CUDA context and no OpenMP thread pool
started (a child of a process that ran a parallel torch operation hangs in its first one):
:func:`forking_allowed` says so, and the supervisor starts fresh interpreters otherwise. On an
emulated network the child joins its rank's namespaces itself (``setns``, as ``nsenter`` and
``ip netns exec`` do for a fresh interpreter: :meth:`mlbench.network.emulation.LocalNetwork.enter`).
"""

from __future__ import annotations

import ctypes
import importlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn
from pathlib import Path

from mlbench.safefile import open_append

#: What a worker imports before its first step (the task's own runtime is added per run).
PRELOADED_MODULES = ("torch", "mlbench.worker.__main__", "mlbench.worker.trainer",
                     "mlbench.results.environment")
#: Set in the environment to start every worker as a fresh interpreter (the behaviour before forking).
NO_FORK_ENV = "MLBENCH_NO_FORK"
_WAIT_POLL_SECONDS = 0.02
#: This process's thread count right after :func:`forking_allowed` imported torch (None: torch
#: was imported before, perhaps computed with: never fork).
_THREADS_AFTER_IMPORT: int | None = None
#: In a child: the parent's standard stream objects, kept alive (see _become_a_fresh_process).
_PARENT_STREAMS: list[object] = []


class ForkedProcess:
    """A forked child with the part of :class:`subprocess.Popen` the supervisor uses."""

    def __init__(self, pid: int, args: Sequence[str]):
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code (minus the signal's number for a signal), or None while it runs."""
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: nothing more can be known
                self.returncode = 1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(_WAIT_POLL_SECONDS)
        assert self.returncode is not None
        return self.returncode


def import_torch() -> None:
    """Import torch in this process, noting its thread count right after: call it before anything
    else imports torch in a process that may fork ranks later (the CLI reading a real data set
    does, before its supervisor starts the ranks), or :func:`forking_allowed` cannot know that
    torch has computed nothing yet and starts fresh interpreters."""
    global _THREADS_AFTER_IMPORT
    if "torch" not in sys.modules:
        importlib.import_module("torch")
        _THREADS_AFTER_IMPORT = _os_threads()


def forking_allowed(runtime_module: str | None) -> bool:
    """Import what every rank needs (torch, the worker, the task's runtime ``runtime_module``) and
    say whether ranks may be forked from this process (:func:`may_fork`)."""
    if not _may_fork_at_all():
        return False
    try:
        import_torch()
        for name in (*PRELOADED_MODULES, *([runtime_module] if runtime_module else [])):
            importlib.import_module(name)
    except Exception:  # a fresh worker will fail on it too, and report it as the run's error
        return False
    return may_fork()


def preload_port(worker_module: str) -> bool:
    """Import a port's framework here too (its worker module's ``preload``), so that each forked
    rank shares it instead of importing it again (TensorFlow's import: about 7 CPU-seconds per
    rank on a 2-core box), and say whether ranks may still be forked (:func:`may_fork`): neither
    TensorFlow's nor JAX's import starts a thread, and if a version's did, the ranks would be
    fresh interpreters. A framework that fails to import here is left to the fresh workers,
    which report the error as the run's."""
    try:
        importlib.import_module(worker_module).preload()
    except Exception:
        return False
    return may_fork()


def may_fork() -> bool:
    """Whether a child forked from this process now may go on in Python and use torch.

    Only from a process that has one thread of Python, no CUDA context, and whose torch has run
    no parallel operation: GNU OpenMP's thread pool, once started, does not survive a fork (the
    child's first parallel operation waits for ever). That is known for sure where torch is not
    imported yet (the child imports it itself), or was imported through :func:`import_torch`
    (nothing computed with it before) and the process has no more threads than right after that
    import (the pool's threads stay once started)."""
    if not _may_fork_at_all():
        return False
    if "torch" not in sys.modules:
        return True
    cuda = sys.modules.get("torch.cuda")
    if cuda is not None and cuda.is_initialized():
        return False
    return _THREADS_AFTER_IMPORT is not None and _os_threads() <= _THREADS_AFTER_IMPORT


def _may_fork_at_all() -> bool:
    return (sys.platform.startswith("linux") and not os.environ.get(NO_FORK_ENV)
            and threading.active_count() == 1)


def _os_threads() -> int:
    """This process's threads, native ones included (OpenMP's, OpenBLAS's)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1 << 30   # cannot tell: never fork


def fork_worker(worker_args: Sequence[str], log: Path, env: dict[str, str], keep_fds: Sequence[int] = (),
                before_main: Callable[[], None] | None = None,
                enter: Callable[[], None] | None = None, module: str = "mlbench.worker") -> ForkedProcess:
    """Fork a child that runs ``python -m MODULE WORKER_ARGS`` in this interpreter: the PyTorch
    worker, or a port's (``module``, :attr:`mlbench.frameworks.Framework.worker`, whose framework
    :func:`preload_port` imported here; the child makes every object of it).

    ``log`` receives its stdout and stderr (appended, created private); ``keep_fds`` stay open
    in the child (a listening socket); ``before_main`` runs first in the child (tying it to
    this process's life); ``enter`` runs once the child's streams are its log's (joining the
    emulated network's namespaces: its failure is the worker's, told in its log)."""
    rank = worker_args[worker_args.index("--rank") + 1] if "--rank" in worker_args else "?"

    def worker_main() -> int:
        entry = importlib.import_module(module)
        if not hasattr(entry, "main"):   # a package run with -m: its __main__ module
            entry = importlib.import_module(f"{module}.__main__")
        return int(entry.main(list(worker_args)))

    return fork_process(worker_main, module, worker_args, f"mlbench-rank{rank}", log, env,
                        keep_fds, before_main, enter)


def fork_process(main: Callable[[], int | None], module: str, args: Sequence[str], name: str, log: Path,
                 env: dict[str, str], keep_fds: Sequence[int] = (),
                 before_main: Callable[[], None] | None = None,
                 enter: Callable[[], None] | None = None) -> ForkedProcess:
    """Fork a child that is ``python -m MODULE ARGS`` (its ``sys.argv``), running ``main`` in this
    interpreter in a session of its own, named ``name`` (``ps -o comm``, ``pgrep``, at most 15
    characters); call it only where :func:`may_fork` says so (:func:`forking_allowed` for a rank,
    which also imports what the rank needs). ``log``, ``keep_fds``, ``before_main`` and ``enter``
    as for :func:`fork_worker`."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # or the child would write this process's buffered output once more
    with open_append(log) as opened:   # mode 600, never through a link (as the spawned workers' logs)
        pid = os.fork()
        if pid == 0:
            _child(main, [sys.executable, "-m", module, *args], name, opened.fileno(), env, keep_fds,
                   before_main, enter)   # never returns
    return ForkedProcess(pid, [module, *args])


def _child(main: Callable[[], int | None], argv: list[str], name: str, log_fd: int, env: dict[str, str],
           keep_fds: Sequence[int], before_main: Callable[[], None] | None,
           enter: Callable[[], None] | None) -> NoReturn:
    """The forked child: becomes the process ``argv`` names, runs ``main``, and exits with its
    code, whatever happens."""
    code: int | None = 1
    try:
        os.setsid()
        if before_main is not None:
            before_main()
        _become_a_fresh_process(log_fd, env, keep_fds, argv)
        if enter is not None:
            enter()
        _name_this_process(name)
        code = main()
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:  # whatever happens, the child must end here
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code or 0)


def _become_a_fresh_process(log_fd: int, env: dict[str, str], keep_fds: Sequence[int], argv: list[str]) -> None:
    """In the child: the standard streams, descriptors, signals and environment that
    ``subprocess.Popen(..., close_fds=True)`` of a new interpreter would have given it."""
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    # The parent's other descriptors (its store, pipes a caller waits on to close) must not stay
    # open here. They are pointed at /dev/null rather than closed: the parent's Python objects
    # that own them live on in this copy, and one collected later would close a reused number.
    keep = {0, 1, 2, devnull, *keep_fds}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.dup2(devnull, fd, inheritable=False)
            except OSError:  # the listing's own descriptor, already closed
                pass
    # the parent's stream objects own descriptors 0-2 and would close them when collected
    _PARENT_STREAMS.extend([sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__])
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True, write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True, write_through=True)
    os.environ.clear()
    os.environ.update(env)
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    sys.argv = argv


def _name_this_process(name: str) -> None:
    """The child keeps its parent's command line; its name (``ps -o comm``, ``pgrep``, ``top``)
    at least says what it is: ``mlbench-rank1``."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(15, name.encode()[:15])  # PR_SET_NAME
    except OSError:
        pass

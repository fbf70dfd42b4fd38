"""`python -m mlbench ARGS` for the tests, forked from one interpreter that imported torch once
(and ``python -m mlbench.worker ...`` or ``mlbench.server`` where a test stands in for a kubelet's
pod or a user's launcher: :func:`popen_module`).

Every real run the suite starts used to cost a fresh interpreter's import of torch and the CLI
(3-5 CPU seconds on this project's 2-core machines) before its first step; with a few hundred
runs that was most of the suite's CPU, and under load most of its time (issue 20). As Android's
zygote, Spring (Rails) or nailgun do, this module keeps one server process that has imported the
CLI, torch and every task's runtime (computing nothing with them, so that forking stays safe:
``mlbench.launch.forked.forking_allowed``), and forks a child per command. The child becomes the
process a fresh ``python -m mlbench ARGS`` would have been: the test's working directory,
environment (its PYTHONPATH entries on ``sys.path``), standard streams (passed over the Unix
socket), its own session if asked, default signal handlers; it runs ``mlbench.__main__`` with
``runpy`` exactly as ``-m`` does, then shuts down as an interpreter does (non-daemon threads
joined, ``atexit`` handlers run, streams flushed). What the command does from there (the local
supervisor forking its ranks, a detached supervisor, sbatch, pods) is the product's own code.

Only the interpreter's start-up is shared; the packaging test still runs the installed console
script, and ``MLBENCH_TEST_FRESH_CLI=1`` makes every command a fresh interpreter again.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import BinaryIO

FRESH_ENV = "MLBENCH_TEST_FRESH_CLI"
_REPO = Path(__file__).resolve().parents[1]
_MAX_REQUEST = 1 << 20


# --- the server ------------------------------------------------------------------------------

def _preload() -> None:
    """What a command would import: the CLI with its commands, torch, the worker and every task's
    runtime (through the product's own check, which records the thread count forking relies on),
    and torch's flop counter with its own imports."""
    from mlbench.cli import commands  # noqa: F401  (registers the commands)
    from mlbench.cli.main import main  # noqa: F401
    from mlbench.launch.forked import forking_allowed
    from mlbench.tasks.registry import TASKS

    assert forking_allowed(None), "the zygote must be able to fork ranks (one thread, torch untouched)"
    for task in TASKS:
        try:
            importlib.import_module(TASKS.runtime_module(task))
        except Exception:  # an optional dependency missing: the command imports (and fails) itself
            pass
    # what the supervisor of a run whose model's FLOPs are counted (task 1a) imports before it
    # forks its ranks (the classification runtime's prepare_before_fork): once here for them all
    from mlbench.tasks.flops import preload_flop_counter

    preload_flop_counter()


def serve(path: str) -> None:
    """Accept commands on the Unix socket ``path`` until the parent (the test session) is gone."""
    parent = os.getppid()
    _preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    waiting: dict[int, socket.socket] = {}   # child pid -> the connection that asked for it
    while os.getppid() == parent:
        ready, _, _ = select.select([listener], [], [], 0.05)
        if ready:
            conn, _ = listener.accept()
            pid = _start(conn, listener, waiting)
            if pid:
                waiting[pid] = conn
        while waiting:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = waiting.pop(pid, None)
            if conn is not None:
                code = os.waitstatus_to_exitcode(status)
                try:
                    conn.sendall(json.dumps({"exit": code}).encode() + b"\n")
                except OSError:
                    pass
                conn.close()


def _start(conn: socket.socket, listener: socket.socket, waiting: dict[int, socket.socket]) -> int:
    """Read one request (JSON and the three standard streams) and fork its child; its pid."""
    message, fds, _, _ = socket.recv_fds(conn, _MAX_REQUEST, 3)
    request = json.loads(message)
    pid = os.fork()
    if pid == 0:
        try:
            listener.close()
            for other in waiting.values():
                other.close()
            code = _become_the_command(request, fds)
        except BaseException:  # the child must never return into the server's loop
            import traceback

            traceback.print_exc()
            code = 1
        os._exit(code)
    for fd in fds:
        os.close(fd)
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    return pid


def _become_the_command(request: dict, fds: list[int]) -> int:
    """In the child: be ``python -m MODULE ARGS`` (MODULE: ``mlbench`` unless the request names
    another of mlbench's modules) and return its exit code."""
    # threads do not survive a fork: what forking_allowed compares with is this process's count now
    # (an OpenMP pool the command starts must show as more threads than this, as in a fresh interpreter)
    from mlbench.launch import forked

    forked._THREADS_AFTER_IMPORT = forked._os_threads()
    if request.get("new_session"):
        os.setsid()
    for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    own = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    started = [p for p in request["zygote_pythonpath"] if p]
    sys.path[:] = [request["cwd"], *own, *(p for p in sys.path[1:] if p not in started and p not in own)]
    importlib.invalidate_caches()
    module = request.get("module", "mlbench")
    # as in a fresh interpreter, the module's __main__ runs as __main__ only (the preload may have
    # imported it by name, mlbench.worker's: runpy would warn, on the log's first line)
    sys.modules.pop(f"{module}.__main__", None)
    sys.argv = [module, *request["args"]]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as ended:
        code = _exit_code(ended.code)
    except KeyboardInterrupt:
        code = 130
        import traceback

        traceback.print_exc()
    except BaseException:  # as the interpreter would: the traceback, then 1
        import traceback

        traceback.print_exc()
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # join non-daemon threads, as at exit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return code


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


# --- the client ------------------------------------------------------------------------------

class _Server:
    """The session's zygote, started on first use and ended with the test session."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="mlbench-zygote-")
        self.path = os.path.join(self.folder, "socket")
        self.pythonpath = os.environ.get("PYTHONPATH", "").split(os.pathsep)
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.zygote", self.path], cwd=str(_REPO),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if line.strip() != "ready":
            raise RuntimeError(f"the tests' zygote did not start (exit {self.proc.poll()})")
        atexit.register(self.stop)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        try:
            os.unlink(self.path)
            os.rmdir(self.folder)
        except OSError:
            pass


_server: _Server | None = None
_server_lock = threading.Lock()


def _the_server() -> _Server:
    global _server
    with _server_lock:
        if _server is None or _server.proc.poll() is not None:
            _server = _Server()
        return _server


class ZygoteProcess:
    """A command forked by the zygote, with the part of :class:`subprocess.Popen` tests use:
    ``python -m MODULE ARGS``, its two output streams kept for :meth:`output`, or both written to
    the open file ``log`` (as ``stdout=log, stderr=subprocess.STDOUT``)."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: str | None = None,
                 new_session: bool = False, module: str = "mlbench", log: BinaryIO | None = None) -> None:
        server = _the_server()
        self.args = [sys.executable, "-m", module, *args]
        self._out: BinaryIO | None = None
        self._err: BinaryIO | None = None
        if log is None:
            self._out = tempfile.TemporaryFile()  # noqa: SIM115 - read and closed in output()
            self._err = tempfile.TemporaryFile()  # noqa: SIM115 - read and closed in output()
            outputs = [self._out.fileno(), self._err.fileno()]
        else:
            outputs = [log.fileno()] * 2
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._conn.connect(server.path)
        request = {"args": list(args), "env": env, "cwd": cwd or os.getcwd(), "new_session": new_session,
                   "zygote_pythonpath": server.pythonpath, "module": module}
        with open(os.devnull, "rb") as stdin:
            socket.send_fds(self._conn, [json.dumps(request).encode()], [stdin.fileno(), *outputs])
        self._reader = self._conn.makefile("r")
        self.pid = int(json.loads(self._reader.readline())["pid"])
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            ready, _, _ = select.select([self._conn], [], [], 0)
            if ready:
                self._read_exit()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            ready, _, _ = select.select([self._conn], [], [], timeout)
            if not ready:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._read_exit()
        assert self.returncode is not None
        return self.returncode

    def _read_exit(self) -> None:
        line = self._reader.readline()
        self.returncode = int(json.loads(line)["exit"]) if line else -signal.SIGKILL
        self._conn.close()

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """As :meth:`subprocess.Popen.communicate` with both streams piped as text: wait for the
        end (``subprocess.TimeoutExpired`` if it runs past ``timeout``, the command going on),
        then what it wrote."""
        self.wait(timeout)
        return self.output()

    def output(self) -> tuple[str, str]:
        """What the command wrote to stdout and stderr (after it ended)."""
        texts = []
        for file in (self._out, self._err):
            if file is None:   # written to the caller's log
                return "", ""
            file.seek(0)
            texts.append(file.read().decode(errors="replace"))
            file.close()
        return texts[0], texts[1]


def start(args: list[str], env: dict[str, str], fresh: bool = False) -> ZygoteProcess | subprocess.Popen:
    """``python -m mlbench ARGS`` in the background in a session of its own (a Ctrl-C for it
    alone), with its streams read as text by ``communicate``; ``fresh``: a new interpreter."""
    if fresh or os.environ.get(FRESH_ENV):
        return subprocess.Popen([sys.executable, "-m", "mlbench", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    return ZygoteProcess(args, env, new_session=True)


def popen_module(cmd: list[str], env: dict[str, str], log: BinaryIO,
                 cwd: str | None = None) -> ZygoteProcess | subprocess.Popen:
    """``subprocess.Popen(cmd, env=env, cwd=cwd, stdin=DEVNULL, stdout=log, stderr=STDOUT,
    start_new_session=True)``, forked by the zygote where ``cmd`` is ``python -m mlbench...``
    (a module of mlbench's: a worker or the results service, as a stand-in kubelet's pod or a
    user's launcher starts them); any other command, or with ``MLBENCH_TEST_FRESH_CLI``, as such."""
    if len(cmd) >= 3 and cmd[0] == sys.executable and cmd[1] == "-m" and cmd[2].split(".")[0] == "mlbench" \
            and not os.environ.get(FRESH_ENV):
        return ZygoteProcess(cmd[3:], env, cwd, new_session=True, module=cmd[2], log=log)
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def run(args: list[str], env: dict[str, str], timeout: float, cwd: str | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run([python, -m, mlbench, *args], capture_output=True, text=True, timeout=...)``."""
    if os.environ.get(FRESH_ENV):
        return subprocess.run([sys.executable, "-m", "mlbench", *args], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=cwd)
    proc = ZygoteProcess(args, env, cwd)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)
        out, err = proc.output()
        raise subprocess.TimeoutExpired(proc.args, timeout, output=out, stderr=err) from None
    out, err = proc.output()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.zygote SOCKET")
    # No PR_SET_PDEATHSIG: it fires when the *thread* that started this server ends, and the
    # first command of a module may come from a helper thread (the dashboard lab's runs): the
    # server was killed when that thread ended, and every command still running read as SIGKILLed.
    # serve() ends once the test session is gone (its parent changes).
    serve(sys.argv[1])

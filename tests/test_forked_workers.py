"""Local workers forked from the supervisor (mlbench.launch.forked) look like fresh processes.

A forked rank must not keep what its parent had open (the catalog's database, the pipe a caller
reads the CLI's output from), must run in its own session with the run's environment, and log
to its own private file; the same holds for workers started as fresh interpreters
(MLBENCH_NO_FORK=1, and always inside the emulated network's namespaces)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mlbench.launch.supervisor import pid_alive
from mlbench.results.store import RunStore
from tests.helpers import wait_for

LONG_RUN = ("run", "task2a", "2", "--data", "synthetic", "--set", "max_epochs=100000", "--max-steps", "100000",
            "--log-every", "2")


def environment_that_forks() -> dict[str, str]:
    """This process's environment without MLBENCH_NO_FORK (which a developer may have set)."""
    return {k: v for k, v in os.environ.items() if k != "MLBENCH_NO_FORK"}


@contextlib.contextmanager
def cli_running(*args: str, env: dict[str, str]):
    """`python -m mlbench ARGS` running (its output on pipes), killed if the test leaves it running."""
    cli = subprocess.Popen([sys.executable, "-m", "mlbench", *args], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=env)
    try:
        yield cli
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.communicate()


def interrupted(cli: subprocess.Popen, timeout: float = 60) -> None:
    """SIGINT to the CLI (Ctrl-C), then wait for it to exit; if it does not, the assertion says
    what the kernel knows of it (its signal masks: was SIGINT ignored, blocked or pending; what
    each thread waits in) and what it printed. (This is how a suite started in the background
    was found to pass SIGINT on ignored: tests/conftest.py, ctrl_c_reaches_the_tests_commands.)"""
    cli.send_signal(signal.SIGINT)
    try:
        cli.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        state = {}
        with contextlib.suppress(OSError):
            state = {k: v.strip() for k, v in (line.split(":", 1) for line in
                                               Path(f"/proc/{cli.pid}/status").read_text().splitlines())
                     if k in ("State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")}
            state["threads"] = {t: (Path(f"/proc/{cli.pid}/task/{t}/wchan").read_text(),
                                    Path(f"/proc/{cli.pid}/task/{t}/stat").read_text().split(")")[1].split()[0])
                                for t in os.listdir(f"/proc/{cli.pid}/task")}
        cli.kill()
        out, err = cli.communicate()
        raise AssertionError(f"the CLI did not exit {timeout} s after SIGINT (SIGINT is bit 2 of the masks): "
                             f"{state}\nstdout: {out[-2000:]!r}\nstderr: {err[-2000:]!r}") from None


def running_workers(timeout: float = 120) -> tuple[object, list[int]]:
    def ready():
        runs = RunStore().list()
        if not runs or not (runs[-1].run_dir / "pids.json").exists():
            return None
        beats = runs[-1].run_dir / "heartbeats"
        workers = json.loads((runs[-1].run_dir / "pids.json").read_text())["workers"]
        return (runs[-1], workers) if beats.exists() and len(list(beats.iterdir())) == 2 else None
    return wait_for(ready, timeout, "both workers to run")


def open_files(pid: int) -> dict[int, str]:
    fds = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            fds[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            pass
    return fds


def process_name(pid: int) -> str:
    """What ``ps -o comm`` shows for ``pid``."""
    return Path(f"/proc/{pid}/comm").read_text().strip()


def environment(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)


@pytest.mark.parametrize("fresh", [False, True], ids=["forked", "fresh-interpreter"])
def test_a_local_worker_holds_nothing_of_its_parent_and_runs_in_its_own_session(fresh):
    env = dict(os.environ, MLBENCH_NO_FORK="1") if fresh else environment_that_forks()
    with cli_running(*LONG_RUN, env=env) as cli:
        run, workers = running_workers()
        output_pipes = {os.readlink(f"/proc/{cli.pid}/fd/{fd}") for fd in (1, 2)}
        for rank, pid in enumerate(workers):
            files = open_files(pid)
            assert files[0] == "/dev/null" and files[1] == files[2] == str(run.run_dir / "logs" / f"rank-{rank}.log")
            assert not output_pipes & set(files.values()), files     # the caller's pipes close with the CLI
            assert not [f for f in files.values() if f.endswith("runs.db")], files
            assert os.getsid(pid) == pid                              # its own session (a group to signal)
            threads = json.loads((run.run_dir / "run.json").read_text())["config"]["threads_per_worker"]
            if fresh:   # a forked child's /proc/PID/environ is its parent's (os.environ changed after)
                assert environment(pid)["OMP_NUM_THREADS"] == str(threads)
            assert stat.S_IMODE(os.stat(files[1]).st_mode) == 0o600
            name = process_name(pid)
            assert fresh or name == f"mlbench-rank{rank}", name
        interrupted(cli)
        assert cli.returncode == 130
        # gone within the bound the launcher matrix gives a cancel (tests/launcher_matrix.py); on a
        # loaded box the forked ranks were seen alive for a moment after the CLI had exited
        wait_for(lambda: not [pid for pid in workers if pid_alive(pid)], 30, "the cancelled run's workers to exit")
        assert RunStore().get(run.id).state == "cancelled"


@pytest.mark.parametrize("task, data", [("task1a", "cifar_small_dir"), ("task2a", "libsvm_dir")])
def test_a_run_on_a_real_data_set_still_forks_its_ranks(task, data, request):
    """The CLI reads (checks) a real data set before its supervisor starts the ranks: that must
    leave torch's OpenMP pool unstarted and be seen as torch's first import, or every rank is a
    fresh interpreter importing torch again (seen: a fresh CLI never forked a CIFAR-10 run)."""
    with cli_running("run", task, "2", "--data-dir", str(request.getfixturevalue(data)), "--max-steps", "100000",
                     "--log-every", "2", "--no-stop", env=environment_that_forks()) as cli:
        _, workers = running_workers()
        assert [process_name(pid) for pid in workers] == ["mlbench-rank0", "mlbench-rank1"]
        interrupted(cli)
        assert cli.returncode == 130
        wait_for(lambda: not [pid for pid in workers if pid_alive(pid)], 30, "the cancelled run's workers to exit")


def test_a_detached_supervisor_is_forked_holding_nothing_of_the_cli_and_forks_its_ranks():
    """`run --detach` forks the background supervisor from the CLI (no second import of torch):
    it must let go of the caller's pipes (``$(mlbench run --detach)`` returns at once), live in a
    session of its own, and still fork the ranks."""
    env = environment_that_forks()
    # run() reads the CLI's output to its end: it returns only once no process holds those pipes
    started = subprocess.run([sys.executable, "-m", "mlbench", *LONG_RUN, "--detach", "-o", "json"],
                             capture_output=True, text=True, timeout=120, env=env)
    run_id = json.loads(started.stdout)["id"]
    try:
        run, workers = running_workers()
        assert run.id == run_id
        supervisor = RunStore().get(run_id).supervisor_pid
        assert process_name(supervisor) == "mlbench-superv"
        assert os.getsid(supervisor) == supervisor
        files = open_files(supervisor)
        assert files[0] == "/dev/null" and files[1] == files[2] == str(run.run_dir / "logs" / "supervisor.log")
        assert [process_name(pid) for pid in workers] == ["mlbench-rank0", "mlbench-rank1"]
    finally:
        cancelled = subprocess.run([sys.executable, "-m", "mlbench", "cancel", run_id], capture_output=True,
                                   text=True, timeout=120, env=env)
    assert cancelled.returncode == 0, cancelled.stderr
    assert RunStore().get(run_id).state == "cancelled"
    wait_for(lambda: not [pid for pid in (supervisor, *workers) if pid_alive(pid)], 30, "the run's processes to exit")


FORKING_ALLOWED = ("from mlbench.launch.forked import forking_allowed; "
                   "print(forking_allowed('mlbench.tasks.classification_runtime'))")


@pytest.mark.parametrize("before, allowed", [
    ("", True),                                                       # torch imported for the workers
    ("import torch; torch.ones(1)", False),                           # imported before: unknown past
    ("import torch; x = torch.randn(1500, 1500); x @ x", False),     # OpenMP's pool started: a fork hangs
    ("import threading, time; threading.Thread(target=time.sleep, args=(5,), daemon=True).start()", False),
    ("import os; os.environ['MLBENCH_NO_FORK'] = '1'", False),
])
def test_ranks_are_forked_only_from_a_process_that_computed_nothing_with_torch(before, allowed):
    code = f"{before}\n{FORKING_ALLOWED}"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=environment_that_forks())
    assert proc.stdout.strip() == str(allowed), proc.stderr


def test_a_ports_framework_is_imported_once_by_the_supervisor_and_its_ranks_still_forked():
    """The local supervisor imports a port's framework before it forks the ranks (each rank then
    shares it: TensorFlow's import cost every rank about 7 CPU-seconds): that import must leave
    forking allowed (no thread started), or every rank of a port would be a fresh interpreter.
    One process for both frameworks, one after the other, as a supervisor of either would."""
    frameworks = [name for name in ("jax", "tensorflow") if importlib.util.find_spec(name) is not None]
    if not frameworks:
        pytest.skip("neither JAX nor TensorFlow is installed (pip install 'mlbench-suite[jax,tensorflow]')")
    code = (f"{FORKING_ALLOWED}\nimport sys\nfrom mlbench.frameworks import get_framework\n"
            f"from mlbench.launch.forked import preload_port\n"
            f"for name in {frameworks!r}:\n"
            f"    print(name, preload_port(get_framework(name).worker), name in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                          env=environment_that_forks())
    assert proc.stdout.split() == ["True", *[word for name in frameworks for word in (name, "True", "True")]], (
        proc.stdout + proc.stderr)


FLOP_COUNTER_BEFORE_FORK = """
import os, sys
from mlbench.launch.forked import forking_allowed, may_fork
print(forking_allowed('mlbench.tasks.classification_runtime'))
from mlbench.launch.plan import RunRequest, build_config
from mlbench.tasks.classification_runtime import prepare_before_fork
for task in ('task2a', 'task1a'):
    prepare_before_fork(build_config(RunRequest(task=task, workers=2))[0])
    print(task, 'torch._dynamo' in sys.modules, may_fork())
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    import torch
    from mlbench.tasks.flops import counted_flops
    from mlbench.tasks.models import build_model
    model = build_model('resnet20')
    before = set(sys.modules)
    counted_flops(model, torch.zeros(1, 3, 32, 32), 1)
    new = sorted(set(sys.modules) - before)
    os.write(write, (f'{len(new)}: ' + ' '.join(new[:8]) if new else 'none').encode())
    os._exit(0)
os.waitpid(pid, 0)
print('imported by the rank:', os.read(read, 1 << 20).decode())
"""


def test_a_supervisor_imports_what_the_flop_counter_needs_once_for_the_ranks_it_forks():
    """A rank of task 1a counts its model's FLOPs (torch's FlopCounterMode), whose first use
    imports torch._dynamo: 1.3 CPU-seconds per rank. The supervisor imports it once before it
    forks them (for a model whose FLOPs are counted, not for task 2a's logistic regression), and
    may still fork; a forked rank's count then imports no module of its own."""
    proc = subprocess.run([sys.executable, "-c", FLOP_COUNTER_BEFORE_FORK], capture_output=True, text=True,
                          timeout=240, env=environment_that_forks())
    assert proc.stdout.splitlines() == ["True", "task2a False True", "task1a True True",
                                        "imported by the rank: none"], proc.stdout + proc.stderr


def test_after_a_parallel_operation_the_fork_would_hang_so_the_check_is_needed():
    """Why forking_allowed refuses a process whose torch computed in parallel: its child's first
    parallel operation never returns (GNU OpenMP). The child is given 6 s, then killed: its
    product takes well under a second even on a loaded 2-core box (a tenth of a second idle),
    and one that ends in time is one that did not hang."""
    code = ("import os, sys, torch\nx = torch.randn(1500, 1500); x @ x\ntorch.set_num_threads(2)\n"
            "pid = os.fork()\nif pid == 0:\n    x @ x; os._exit(0)\n"
            "import time\nfor _ in range(60):\n    done, status = os.waitpid(pid, os.WNOHANG)\n"
            "    if done: print('ended'); sys.exit(0)\n    time.sleep(0.1)\n"
            "os.kill(pid, 9); print('hung')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    if os.cpu_count() == 1:
        pytest.skip("one CPU: OpenMP starts no pool")
    assert proc.stdout.strip() == "hung", proc.stdout + proc.stderr

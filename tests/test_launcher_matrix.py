"""The launcher matrix for the launchers of this machine: local processes, mpirun (where this
PyTorch has MPI and Open MPI is installed) and workers started by torchrun (``--record-only``),
each x {cancel from the CLI, cancel from the dashboard, end of run seen by `status` and by the
dashboard} (tests/launcher_matrix.py; Slurm's and Kubernetes' rows are in tests/slurm and
tests/kube, beside their real daemons)."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys

import pytest

from mlbench.launch.supervisor import pid_alive, recorded_processes
from mlbench.results.store import RunStore, read_json
from tests import zygote
from tests.helpers import mlbench, wait_for
from tests.launcher_matrix import (
    LauncherCase,
    check_cancel_from_the_cli,
    check_cancel_from_the_dashboard,
    check_end_seen_by_status_and_the_dashboard,
)

ENDLESS = ("task2a", "2", "--data", "synthetic", "--max-steps", "1000000", "--no-stop", "--log-every", "5")
SHORT = ("task2a", "1", "--data", "synthetic", "--max-steps", "4", "--log-every", "2")
ACTIONS = {"cancel-cli": check_cancel_from_the_cli, "cancel-dashboard": check_cancel_from_the_dashboard,
           "end": check_end_seen_by_status_and_the_dashboard}


def _started(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.split("Started run ")[1].split()[0]


def _running_with_workers(run_id: str) -> str:
    """Waits until the run's supervisor recorded its worker processes and rank 0 trains."""
    run = RunStore().get(run_id)
    wait_for(lambda: (run.run_dir / "pids.json").exists() and (run.run_dir / "events" / "rank-0.jsonl").exists(),
             120, f"run {run_id}'s workers")
    return run_id


def _processes_gone(run_id: str) -> bool:
    """The run's supervisor, workers (and mpirun) are no longer running."""
    run = RunStore().get(run_id)
    try:
        supervisor = read_json(run.run_dir / "pids.json").get("supervisor")
    except OSError:
        supervisor = None
    return not pid_alive(supervisor) and not any(p.alive() for p in recorded_processes(run.run_dir))


def local_case(*backend: str) -> LauncherCase:
    return LauncherCase(
        name="local" if not backend else "local (mpirun)",
        start_endless=lambda: _running_with_workers(_started(mlbench("run", *ENDLESS, *backend, "--detach"))),
        start_short=lambda: _started(mlbench("run", *SHORT, *backend, "--detach")),
        workers_gone=_processes_gone)


def torchrun() -> list[str]:
    path = shutil.which("torchrun")
    return [path] if path else [sys.executable, "-m", "torch.distributed.run"]


class TorchrunCase:
    """``--record-only`` runs whose workers torchrun starts, as a user would."""

    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen] = {}

    def _record_and_start(self, *args: str) -> str:
        proc = mlbench("run", *args, "--record-only", check=True)
        run_id = proc.stdout.split("Recorded run ")[1].split()[0]
        run = RunStore().get(run_id)
        self.procs[run_id] = subprocess.Popen(
            [*torchrun(), "--standalone", "--nproc-per-node", str(run.workers), "-m", "mlbench.worker",
             str(run.run_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        return run_id

    def start_endless(self) -> str:
        run_id = self._record_and_start(*ENDLESS)
        run = RunStore().get(run_id)
        wait_for(lambda: (run.run_dir / "events" / "rank-0.jsonl").exists(), 180, "torchrun's workers")
        return run_id

    def start_short(self) -> str:
        run_id = self._record_and_start(*SHORT)
        assert self.procs[run_id].wait(timeout=300) == 0
        return run_id

    def workers_gone(self, run_id: str) -> bool:
        """The user's launcher owns the workers: mlbench only marks the run, and says so. Here the
        user stops them, as the reason tells."""
        proc = self.procs[run_id]
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
        return True

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def case(request):
    kind = request.param
    if kind == "mpi":
        import torch.distributed as dist

        if shutil.which("mpirun") is None or not dist.is_mpi_available():
            pytest.skip("--backend mpi needs Open MPI's mpirun and a PyTorch built with MPI; "
                        f"here mpirun is {'present' if shutil.which('mpirun') else 'missing'} and "
                        f"PyTorch {'has' if dist.is_mpi_available() else 'has no'} MPI")
        yield local_case("--backend", "mpi")
    elif kind == "external":
        torchrun_case = TorchrunCase()
        yield LauncherCase("external", torchrun_case.start_endless, torchrun_case.start_short,
                           torchrun_case.workers_gone, cancel_reason="stop them with their launcher")
        torchrun_case.close()
    else:
        yield local_case()


@pytest.mark.parametrize("action", list(ACTIONS))
@pytest.mark.parametrize("case", ["local", "mpi", "external"], indirect=True)
def test_every_launcher_cancels_and_ends_its_runs_alike_in_the_cli_and_the_dashboard(case, action):
    """Also what a finished run records of the machines its workers ran on: one, this one, for
    the local launchers and for torchrun here, as for a local run."""
    pytest.importorskip("uvicorn", reason="the dashboard needs uvicorn (pip install 'mlbench-suite[dashboard]')")
    ACTIONS[action](case)
    if action == "end":
        document = read_json(RunStore().list()[-1].run_dir / "run.json")
        assert (document["nodes"], document["on_this_machine"]) == (1, True), case.name


def test_a_torchrun_run_started_with_the_wrong_worker_count_is_marked_failed_with_the_reason():
    """torchrun starts 3 workers for a run recorded for 2: each refuses, and the run, which no
    mlbench process watches, is failed with that reason instead of staying pending."""
    proc = mlbench("run", *SHORT[:1], "2", *SHORT[2:], "--record-only", check=True)
    run_id = proc.stdout.split("Recorded run ")[1].split()[0]
    run = RunStore().get(run_id)
    started = subprocess.run([*torchrun(), "--standalone", "--nproc-per-node", "3", "-m", "mlbench.worker",
                              str(run.run_dir)], capture_output=True, text=True, timeout=300)
    assert started.returncode != 0, started.stdout + started.stderr
    status = mlbench("status", run_id, "-o", "json", check=True)
    details = json.loads(status.stdout)
    assert details["state"] == "failed", details
    assert "torchrun started 3 worker(s) but the run in" in details["reason"], details
    assert "was recorded for 2" in details["reason"], details


def test_a_worker_started_without_a_rank_fails_its_run_naming_the_variables_it_looked_for():
    """A launcher that sets no rank (or a worker started by hand): the worker exits non-zero in
    one line, and the run, which no mlbench process watches, is failed with that line instead of
    staying pending for ever."""
    proc = mlbench("run", *SHORT[:1], "2", *SHORT[2:], "--record-only", check=True)
    run = RunStore().get(proc.stdout.split("Recorded run ")[1].split()[0])
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE") and not k.startswith(("OMPI_", "PMI_", "SLURM_"))}
    started = subprocess.run([sys.executable, "-m", "mlbench.worker", str(run.run_dir)], capture_output=True,
                             text=True, timeout=120, env=env)
    assert started.returncode == 2, started.stdout + started.stderr
    line = ("no rank in this worker's environment (looked for RANK and WORLD_SIZE (torchrun), "
            "OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE (Open MPI), PMI_RANK and PMI_SIZE (MPICH), "
            "SLURM_PROCID and SLURM_JOB_ID (srun)): give --rank R, or start the workers with a launcher "
            "that sets them (torchrun, srun, mpirun); see docs/slurm-and-torchrun.md")
    assert started.stderr == f"Error: {line}\n"
    details = json.loads(mlbench("status", run.id, "-o", "json", check=True).stdout)
    assert (details["state"], details["reason"]) == ("failed", f"worker 0: {line}"), details


def test_torchrun_started_again_on_a_finished_record_only_run_refuses_in_one_line_and_adds_no_event():
    """A recorded run that torchrun starts trains; torchrun started a second time on it, once it has
    finished, finds every worker refusing in one line (the worker's usage exit, 2) that says how to
    train again, instead of a second copy of every event and a second result (seen: 51 lines
    became 101). `mlbench resume` does not continue --record-only runs, so the line offers a new one."""
    proc = mlbench("run", "task2a", "1", "--data", "synthetic", "--max-steps", "4", "--record-only", check=True)
    run = RunStore().get(proc.stdout.split("Recorded run ")[1].split()[0])

    def start() -> subprocess.CompletedProcess:
        return subprocess.run([*torchrun(), "--standalone", "--nproc-per-node", "1", "-m", "mlbench.worker",
                               str(run.run_dir)], capture_output=True, text=True, timeout=300)

    first = start()
    assert first.returncode == 0, first.stdout + first.stderr
    events = (run.run_dir / "events" / "rank-0.jsonl").read_bytes()
    assert b'"name":"result"' in events
    again = start()
    line = (f"Error: the run in {run.run_dir} has finished already (its result is recorded); starting its "
            "workers again would add a second copy of every event. To train again, record a new run: "
            "mlbench run task2a 1 ... --record-only")
    assert again.returncode != 0
    assert [text for text in again.stderr.splitlines() if text.startswith("Error:")] == [line], again.stderr
    assert re.search(r"exitcode\s*:\s*2\b", again.stderr), again.stderr  # torchrun's report of the worker's exit
    assert (run.run_dir / "events" / "rank-0.jsonl").read_bytes() == events
    details = json.loads(mlbench("status", run.id, "-o", "json", check=True).stdout)
    assert details["state"] == "finished" and details["summary"]["steps"] == 4, details
    # seen first when it had ended: its start is still its workers' first record, and status names
    # the launcher that `-o json` did
    assert details["started_at"] is not None and details["started_at"] <= details["finished_at"], details
    shown = mlbench("status", run.id, check=True).stdout
    assert re.search(rf"launcher\s+{details['launcher']}\n", shown) and re.search(r"started\s+\d{4}-", shown), shown


def test_a_worker_given_a_folder_that_is_no_run_says_so_in_one_line(tmp_path):
    """RUN_DIR is typed by the user into a torchrun, srun or mpirun command: a wrong one is a usage
    error of one line (exit 2) naming the folder, not a traceback."""
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "run.json").write_text("{}")
    for folder, what in ((tmp_path / "typo", "holds no run.json"),
                         (tmp_path / "other", f"has no readable run.json ({tmp_path / 'other' / 'run.json'} is not "
                                              "a run document ('task'))")):
        with open(tmp_path / f"{folder.name}.log", "wb") as log:
            started = zygote.popen_module([sys.executable, "-m", "mlbench.worker", str(folder), "--rank", "0"],
                                          dict(os.environ), log)
        assert started.wait(120) == 2
        assert (tmp_path / f"{folder.name}.log").read_text() == (
            f"Error: {folder} {what}: give the run folder that `mlbench run --record-only` printed in its "
            "commands\n")


def test_every_log_and_event_file_of_a_run_is_private_to_its_user():
    """docs/reliability.md says the run store is its user's alone: a local run's files (the workers' logs
    and events, the supervisor's log, run.json, pids.json) are mode 600 whatever the umask, and
    so are those of a torchrun run (its workers' events and a refused worker's error)."""
    run_id = _started(mlbench("run", *SHORT, "--detach"))
    run = RunStore().get(run_id)
    wait_for(lambda: not RunStore().get(run_id).active and _processes_gone(run_id), 240, f"run {run_id}'s end")
    assert RunStore().get(run_id).state == "finished"
    files = sorted(p.relative_to(run.run_dir).as_posix() for p in run.run_dir.rglob("*") if p.is_file())
    assert {"logs/rank-0.log", "logs/supervisor.log", "events/rank-0.jsonl", "run.json", "pids.json"} <= set(files)
    modes = {name: oct(stat.S_IMODE((run.run_dir / name).stat().st_mode)) for name in files}
    assert modes == dict.fromkeys(files, oct(0o600)), modes

    proc = mlbench("run", *SHORT[:1], "2", *SHORT[2:], "--record-only", check=True)
    refused = RunStore().get(proc.stdout.split("Recorded run ")[1].split()[0])
    subprocess.run([sys.executable, "-m", "mlbench.worker", str(refused.run_dir)], capture_output=True,
                   timeout=120, env=dict(os.environ, RANK="0", WORLD_SIZE="3", MASTER_ADDR="127.0.0.1",
                                         MASTER_PORT="29500"))
    events = refused.run_dir / "events" / "rank-0.jsonl"
    assert oct(stat.S_IMODE(events.stat().st_mode)) == oct(0o600)

"""The Slurm launcher's parts that need no cluster: options, batch script, Slurm's answers, blame;
and the mpirun command of --backend mpi."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist
from click.testing import CliRunner

from mlbench.cli import (
    cli,
    commands,  # noqa: F401  (registers the commands)
)
from mlbench.errors import UsageError
from mlbench.launch.faults import parse_inject
from mlbench.launch.injector import FaultRecord, Injector
from mlbench.launch.mpi import mpirun_command
from mlbench.launch.slurm import failure_reason
from mlbench.launch.slurm_jobs import JobState, _json_state
from mlbench.launch.slurm_script import SlurmOptions, render_script
from mlbench.launch.slurm_supervisor import SlurmTask, _send, watchdog_verdict, with_ntasks
from mlbench.results.events import EventWriter, FileSink
from mlbench.results.heartbeat import Beat, write_beat
from mlbench.results.store import RunStore
from tests.helpers import last_run, mlbench


def script(options: SlurmOptions, backend: str = "gloo", run_dir: str = "/shared/mlbench/runs/ab12") -> str:
    return render_script("ab12", "task1a-8w-ab12", Path(run_dir), 8, backend, options.validate(),
                         "/opt/venv/bin/python")


def test_the_batch_script_asks_for_what_the_options_say():
    text = script(SlurmOptions(partition="gpu", account="proj1", time="01:00:00", gpus_per_task=1,
                               cpus_per_task=4, constraint="a100", extra=["#SBATCH --nodes=2", "--mem=8G"],
                               iface="ib0"))
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert directives == ["#SBATCH --job-name=mlbench-ab12", "#SBATCH --ntasks=8", "#SBATCH --cpus-per-task=4",
                          "#SBATCH --chdir=/shared/mlbench/runs/ab12",
                          "#SBATCH --output=/shared/mlbench/runs/ab12/logs/slurm-%j.out",
                          "#SBATCH --partition=gpu", "#SBATCH --account=proj1", "#SBATCH --time=01:00:00",
                          "#SBATCH --constraint=a100", "#SBATCH --gpus-per-task=1", "#SBATCH --nodes=2",
                          "#SBATCH --mem=8G"]
    assert "export MASTER_ADDR MASTER_PORT OMP_NUM_THREADS=4 MKL_NUM_THREADS=4" in text
    assert text.rstrip().endswith("srun --kill-on-bad-exit=1 --output=/shared/mlbench/runs/ab12/logs/rank-%t.log "
                                  "/opt/venv/bin/python -m mlbench.worker /shared/mlbench/runs/ab12 --iface ib0")
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_the_batch_script_of_an_mpi_run_starts_the_ranks_with_mpirun():
    last = script(SlurmOptions(), backend="mpi").rstrip().splitlines()[-1]
    assert last == ("mpirun -np 8 --bind-to none --tag-output /opt/venv/bin/python -m mlbench.worker "
                    "/shared/mlbench/runs/ab12 > /shared/mlbench/runs/ab12/logs/mpirun.log 2>&1")


@pytest.mark.parametrize("options, message", [
    (SlurmOptions(time="1 hour"), "--time '1 hour': give one word"),
    (SlurmOptions(time="90min"), "--time 90min: use Slurm's format"),
    (SlurmOptions(cpus_per_task=0), "--cpus-per-task must be at least 1"),
    (SlurmOptions(extra=["--ntasks=3"]), "mlbench sets --ntasks itself"),
    (SlurmOptions(extra=["#SBATCH -o out.txt"]), "mlbench sets -o itself"),
    (SlurmOptions(extra=["nodes=2"]), "give one sbatch option"),
    (SlurmOptions(extra=["--nodes=2\n#SBATCH --ntasks=3"]), "give one sbatch option"),
])
def test_options_that_would_break_the_job_are_one_line(options, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace("'", "'")):
        options.validate()


def test_a_run_folder_with_a_space_cannot_be_a_batch_script():
    with pytest.raises(UsageError, match="has a space in its path"):
        script(SlurmOptions(), run_dir="/home/me/my runs/ab12")


def test_squeue_json_of_slurm_22_and_23_reads_the_same():
    old = {"job_id": 7, "job_state": "FAILED", "state_reason": "NonZeroExitCode", "exit_code": 256}
    new = {"job_id": 7, "job_state": ["FAILED"], "state_reason": "NonZeroExitCode",
           "exit_code": {"status": ["EXIT"], "return_code": {"set": True, "number": 1},
                         "signal": {"id": {"set": False, "number": 0}, "name": ""}}}
    assert _json_state(old) == _json_state(new) == JobState("FAILED", "NonZeroExitCode", "1:0")
    assert _json_state({"job_state": "RUNNING", "state_reason": "None"}) == JobState("RUNNING", None, None)


def test_the_task_srun_saw_fail_first_is_blamed_with_its_own_error(tmp_path, monkeypatch):
    monkeypatch.setenv("MLBENCH_HOME", str(tmp_path))
    run = RunStore().create(task="task2a", workers=4, division="closed", run_json={"placement": {}})
    (run.run_dir / "logs" / "slurm-12.out").write_text(
        "srun: error: node2: task 0: Terminated\n"   # ended by srun because of the next one
        "srun: error: node3: tasks 2-3: Exited with exit code 1\n"
        "srun: Force Terminated StepId=12.0\n")
    writer = EventWriter(FileSink(run.run_dir, 2), 2)
    writer.emit("error", "DataError: the data set is corrupt", epoch=0, step=0)
    writer.close()
    state = JobState("FAILED", "NonZeroExitCode", "1:0")
    assert failure_reason(run, "12", state, None) == "worker 2 exited with code 1: DataError: the data set is corrupt"
    (run.run_dir / "logs" / "slurm-12.out").write_text("srun: error: node2: task 1: Killed\n")
    (run.run_dir / "logs" / "rank-1.log").write_text("step 5\nstep 6\n")
    assert failure_reason(run, "12", state, None) == "worker 1 was killed: step 6"


def test_slurm_end_states_become_reasons(tmp_path, monkeypatch):
    monkeypatch.setenv("MLBENCH_HOME", str(tmp_path))
    from mlbench.launch.plan import RunRequest
    from mlbench.launch.registry import launcher_class
    from mlbench.run_config import RunDocument

    # recorded as the Slurm launcher records it, without its batch script (no sbatch needed)
    run = launcher_class("slurm")(RunStore()).record(RunRequest(task="task2a", workers=2, data="synthetic"))
    document = RunDocument.load(run.run_dir)
    document.placement = {"slurm": {"time": "00:30:00"}}
    document.save(run.run_dir)
    assert failure_reason(run, "5", JobState("TIMEOUT"), None) == \
        "timed out: Slurm ended job 5 at its time limit (--time 00:30:00)"
    assert failure_reason(run, "5", JobState("NODE_FAIL", "NodeDown"), None) == \
        "node failure: a node of Slurm job 5 failed (NodeDown)"
    assert failure_reason(run, "5", JobState("OUT_OF_MEMORY"), None).startswith("out of memory")
    assert failure_reason(run, "5", JobState("COMPLETED"), "worker 1: boom") == "worker 1: boom"
    assert failure_reason(run, "5", JobState("BOOT_FAIL", "NodeBoot", "0:0"), None) == \
        "Slurm job 5 BOOT_FAIL (NodeBoot), exit code 0:0"


def test_mpirun_starts_every_rank_of_the_run():
    assert mpirun_command(4, "/runs/x", python="/usr/bin/python3", mpirun="/usr/bin/mpirun") == [
        "/usr/bin/mpirun", "-np", "4", "--bind-to", "none", "--tag-output", "--oversubscribe",
        "/usr/bin/python3", "-m", "mlbench.worker", "/runs/x"]
    with pytest.raises(UsageError):
        mpirun_command(0, "/runs/x")


@pytest.mark.skipif(dist.is_mpi_available(), reason="this PyTorch has MPI: the refusal does not apply")
def test_backend_mpi_without_mpi_in_pytorch_is_refused_in_one_line(libsvm_dir):
    result = CliRunner().invoke(cli, ["run", "task2a", "2", "--data-dir", str(libsvm_dir), "--backend", "mpi"])
    assert result.exit_code == 2 and result.stderr.strip() == \
        "Error: --backend mpi: this PyTorch build has no mpi support"


@pytest.mark.skipif(not dist.is_mpi_available() or shutil.which("mpirun") is None,
                    reason="this PyTorch was built without MPI (torch.distributed.is_mpi_available() is "
                           "False) or mpirun is missing: --backend mpi cannot run here")
def test_backend_mpi_runs_the_workers_under_mpirun(libsvm_dir):
    mlbench("run", "task2a", "2", "--data-dir", str(libsvm_dir), "--backend", "mpi", "--max-steps", "4",
            check=True)
    run = last_run()
    assert run.state == "finished" and json.loads((run.run_dir / "run.json").read_text())["config"]["backend"] == "mpi"
    assert (run.run_dir / "logs" / "mpirun.log").exists()


def test_slurm_options_need_slurm_and_exclude_record_only():
    runner = CliRunner()
    result = runner.invoke(cli, ["run", "task2a", "2", "--partition", "gpu"])
    assert result.exit_code == 2 and result.stderr.strip() == \
        "Error: --partition is an option of Slurm runs; add --slurm"
    result = runner.invoke(cli, ["run", "task2a", "2", "--slurm", "--record-only"])
    assert result.exit_code == 2 and "choose one" in result.stderr


def test_slurm_without_its_commands_is_one_line(libsvm_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    result = CliRunner().invoke(cli, ["run", "task2a", "2", "--data-dir", str(libsvm_dir), "--slurm"])
    assert result.exit_code == 2 and result.stderr.strip().startswith("Error: --slurm: `sbatch` is not on PATH")
    assert RunStore().list() == []  # nothing recorded
    assert sys.executable  # the worker command uses this interpreter on the nodes


def test_an_mpi_run_without_mpirun_fails_with_the_reason(libsvm_dir, monkeypatch, tmp_path):
    from mlbench.launch.plan import RunRequest
    from mlbench.launch.registry import launcher_class
    from mlbench.results.store import read_json, write_json_atomic

    store = RunStore()
    local = launcher_class("local")(store)
    run = local.create(RunRequest(task="task2a", workers=2, data_dir=str(libsvm_dir)))
    run_json = read_json(run.run_dir / "run.json")
    run_json["config"]["backend"] = "mpi"  # as recorded where PyTorch has MPI
    write_json_atomic(run.run_dir / "run.json", run_json)
    monkeypatch.setenv("PATH", str(tmp_path))  # no mpirun here
    with pytest.raises(UsageError, match="mpirun is not on PATH"):
        local.run_attached(run)
    final = store.get(run.id)
    assert final.state == "failed" and "the workers could not be started: --backend mpi: mpirun" in final.reason


def test_status_without_slurm_commands_shows_the_run_as_last_recorded(monkeypatch, tmp_path):
    from mlbench.launch.registry import launcher_of

    store = RunStore()
    run = store.create(task="task2a", workers=2, division="closed", launcher="slurm",
                       run_json={"slurm": {"job_id": "77"}})
    store.mark_started(run.id)
    monkeypatch.setenv("PATH", str(tmp_path))  # a laptop that shares the run store, without Slurm
    assert launcher_of(store, run).reconcile(store.get(run.id)).state == "running"
    result = CliRunner().invoke(cli, ["status"])
    assert result.exit_code == 0 and "running" in result.output


def kill_due_on_a_recorded_run() -> tuple[Path, Injector]:
    """A recorded 1-worker run's folder and an injector whose ``kill`` of rank 0 is due."""
    mlbench("run", "task2a", "1", "--data", "synthetic", "--record-only", check=True)
    run_dir = last_run().run_dir
    return run_dir, Injector([parse_inject("kill:rank=0,at=1s")], time.time() - 5, FaultRecord(run_dir), _send)


def test_a_fault_due_before_a_slurm_task_beats_waits_for_it_and_then_strikes():
    """A Slurm task is known to the injector by its heartbeat, which a task still importing
    torch has not written: a kill due then waits for its first beat (as a forked local rank,
    which exists from the start, is struck at once) instead of being recorded as missed. Real
    processes: ``sleep`` stands in for srun's step and for the task."""
    run_dir, injector = kill_due_on_a_recorded_run()
    step, task = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"])
    try:
        tasks = [SlurmTask(run_dir, 0, 1, step)]
        assert injector.apply(tasks) == [] and task.poll() is None and FaultRecord(run_dir).events == []
        now = time.time()
        write_beat(run_dir, Beat(rank=0, time=now, started=now, pid=task.pid, host=socket.gethostname()))
        (event,) = injector.apply(tasks)
        assert (event["kind"], event["rank"], event["at"]) == ("kill", 0, 1.0) and "missed" not in event
        assert task.wait(timeout=10) == -9
        assert FaultRecord(run_dir).events == [event] and injector.apply(tasks) == []
    finally:
        for proc in (step, task):
            proc.kill()
            proc.wait()


def test_a_fault_due_while_a_slurm_step_has_ended_is_missed():
    run_dir, injector = kill_due_on_a_recorded_run()
    step = subprocess.Popen(["true"])
    step.wait()
    (event,) = injector.apply([SlurmTask(run_dir, 0, 1, step)])
    assert event["missed"] == "the worker was not running (starting again, or ended)"


def test_each_step_asks_srun_for_the_groups_size_now():
    """After a shrink (in this job, or in the job before a requeue) the step has fewer tasks than
    the allocation: the supervisor's srun names its size, replacing one it named before."""
    srun = ["srun", "--kill-on-bad-exit=1", "python", "-m", "mlbench.worker", "/runs/ab12"]
    assert with_ntasks(srun, 2) == ["srun", "--ntasks=2", *srun[1:]]
    assert with_ntasks(with_ntasks(srun, 2), 1) == ["srun", "--ntasks=1", *srun[1:]]


def test_a_shrink_leaves_out_the_rank_a_tasks_watchdog_blamed_not_the_task_that_exited(tmp_path):
    """srun names the task whose watchdog exited (the peer of the stalled one); the verdict in
    its error event names the stalled rank, which is the one a shrink must leave out. Error
    events of an earlier step do not count."""
    before = time.time()
    old = EventWriter(FileSink(tmp_path, 0), 0)
    old.emit("error", "watchdog: rank 0 made no progress for 70 s: its process stopped answering", epoch=0, step=0)
    time.sleep(0.01)
    step_started = time.time()
    assert watchdog_verdict(tmp_path, step_started) == ([], "")
    verdict = "watchdog: rank 2 made no progress for 61 s while ranks 0, 1 waited for it in a collective"
    writer = EventWriter(FileSink(tmp_path, 0), 0)
    writer.emit("error", verdict, epoch=0, step=0)
    writer.close()
    assert watchdog_verdict(tmp_path, step_started) == ([2], verdict)
    assert watchdog_verdict(tmp_path, before)[0] == [0]   # the first verdict since then

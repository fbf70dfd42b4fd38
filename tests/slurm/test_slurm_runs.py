"""`mlbench run --slurm`, `status`, `download` and `cancel` against a real one-node Slurm cluster."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import torch
from click.testing import CliRunner

from mlbench.cli import cli
from mlbench.cli import commands  # noqa: F401  (registers the commands)
from mlbench.launch import slurm_jobs
from mlbench.launch.base import LaunchSettings
from mlbench.launch.plan import RunRequest
from mlbench.launch.registry import launcher_class, launcher_of
from mlbench.launch.slurm_script import SCRIPT_NAME
from mlbench.results.store import RunStore
from tests.helpers import checkpoint, last_run, mlbench, run_json
from tests.slurm.conftest import RUN_ARGS

LONG_RUN = ("task2a", "2", "--no-stop", "--set", "max_epochs=100000", "--set", "batch_per_worker=10",
            "--log-every", "5")


def result_sentence(stdout: str) -> str:
    """The result line, its durations (which no two runs share) masked."""
    line = next(line for line in stdout.splitlines() if line.startswith("Goal "))
    return re.sub(r"\d+(\.\d+)?s\b|\d+:\d\d:\d\d", "T", line)


def wait_for(condition, timeout: float = 180.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def worker_pid(run_dir: Path, rank: int) -> int | None:
    """The process of one worker of a run, found by its command line and Slurm rank."""
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"mlbench.worker" in cmdline and str(run_dir).encode() in cmdline \
                and f"SLURM_PROCID={rank}".encode() in environ:
            return int(entry.name)
    return None


def test_a_slurm_run_is_followed_to_its_end_and_equals_the_local_run(slurm, libsvm_dir, local_reference, tmp_path):
    proc = mlbench("run", *RUN_ARGS, "--data-dir", str(libsvm_dir), "--slurm", "--partition", "debug",
                   "--time", "00:10:00", check=True, timeout=300)
    run = last_run()
    assert run.state == "finished" and run.launcher == "slurm" and run.started_at is not None
    job = run_json(run)["slurm"]["job_id"]
    assert f"Submitted Slurm job {job} (2 task(s))" in proc.stdout
    assert "step" in proc.stdout and "test accuracy" in proc.stdout  # the usual progress lines
    # the exactness property: the same parameters, result and result sentence as a local run
    assert result_sentence(proc.stdout) == result_sentence(local_reference.stdout)
    assert run.result["final_accuracy"] == local_reference.result["final_accuracy"]
    assert run.result["steps"] == local_reference.result["steps"] == 6
    for rank in (0, 1):
        for name, value in checkpoint(run, rank).items():
            assert torch.equal(value, local_reference.parameters[rank][name]), (rank, name)
    # what Slurm says about the job agrees, in JSON and in text; this cluster keeps no accounting
    assert slurm_jobs.query(job).state == slurm_jobs.query_squeue_text(job).state == "COMPLETED"
    assert slurm_jobs.query_sacct(job) is None

    details = mlbench("status", run.id, check=True).stdout
    assert "finished" in details and "Goal test accuracy >= 89.00%" in details
    out = tmp_path / "run.zip"
    mlbench("download", run.id, "-o", str(out), check=True)
    with zipfile.ZipFile(out) as zf:
        names = set(zf.namelist())
        assert {SCRIPT_NAME, f"logs/slurm-{job}.out", "logs/rank-0.log", "logs/rank-1.log",
                "events/rank-0.jsonl", "events/rank-1.jsonl"} <= names
        doc = json.loads(zf.read("run.json"))
        assert doc["slurm"]["job_id"] == job and doc["placement"]["slurm"]["partition"] == "debug"
        assert "#SBATCH --ntasks=2" in zf.read(SCRIPT_NAME).decode()


def test_a_task_that_dies_fails_the_run_with_the_reason(slurm, libsvm_dir):
    mlbench("run", *LONG_RUN, "--data-dir", str(libsvm_dir), "--slurm", "--detach", check=True)
    run = last_run()
    wait_for(lambda: (run.run_dir / "events" / "rank-1.jsonl").exists() and worker_pid(run.run_dir, 1),
             what="worker 1")
    os.kill(worker_pid(run.run_dir, 1), signal.SIGKILL)
    wait_for(lambda: not launcher_of(RunStore(), run).reconcile(run).active, timeout=120, what="the run to end")
    run = last_run()
    assert run.state == "failed" and run.reason.startswith("worker 1 was killed"), run.reason
    assert f"failed ({run.reason})" in mlbench("status", run.id, check=True).stdout
    assert slurm_jobs.query(run_json(run)["slurm"]["job_id"]).state == "FAILED"
    assert worker_pid(run.run_dir, 0) is None  # srun ended the other worker too


def test_the_batch_script_is_valid_for_sbatch(slurm, libsvm_dir):
    options = {"partition": "debug", "time": "00:05:00", "cpus_per_task": 1,
               "sbatch_options": ["#SBATCH --nodes=1", "--mem-per-cpu=100M"]}
    request = RunRequest(task="task2a", workers=2, data_dir=str(libsvm_dir), max_steps=3)
    run = launcher_class("slurm")(RunStore(), LaunchSettings(options)).create(request)
    script = run.run_dir / SCRIPT_NAME
    verdict = slurm_jobs.submit(script, test_only=True)
    assert re.search(r"Job \d+ to start at .* using 2 processors on nodes localhost in partition debug",
                     verdict), verdict
    text = script.read_text()
    assert "#SBATCH --nodes=1\n#SBATCH --mem-per-cpu=100M" in text and "#SBATCH --time=00:05:00" in text
    assert run_json(run)["config"]["threads_per_worker"] == 1
    assert run_json(run)["nodes"] == 1 and run_json(run)["on_this_machine"] is False  # --nodes=1


def test_an_option_that_sbatch_refuses_is_one_line_and_fails_the_run(slurm, libsvm_dir):
    result = CliRunner().invoke(cli, ["run", "task2a", "2", "--data-dir", str(libsvm_dir), "--slurm",
                                      "--partition", "nosuchpartition"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert result.stderr.startswith("Error: sbatch refused the job:") and "partition" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    run = last_run()
    assert run.state == "failed" and "could not be submitted" in run.reason


def test_srun_starts_the_workers_of_a_recorded_run(slurm, libsvm_dir, local_reference):
    """`srun -n 2 python -m mlbench.worker RUN_DIR`: ranks from SLURM_PROCID, rank 0 on the first
    node of the step, a port derived from the job, no MASTER_* from anyone."""
    request = RunRequest(task="task2a", workers=2, data_dir=str(libsvm_dir), max_steps=6, seed=3,
                         overrides={"batch_per_worker": 50}, log_every=2, stop_at_goal=False, save_model=True)
    run = launcher_class("external")(RunStore()).create(request)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MASTER_")}
    proc = subprocess.run(["srun", "-n", "2", sys.executable, "-m", "mlbench.worker", str(run.run_dir)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = launcher_of(RunStore(), run).reconcile(run)
    assert run.state == "finished" and run.result["final_accuracy"] == local_reference.result["final_accuracy"]
    for rank in (0, 1):
        for name, value in checkpoint(run, rank).items():
            assert torch.equal(value, local_reference.parameters[rank][name]), (rank, name)

"""Ports, resume and faults of `mlbench run --slurm` against the real one-node Slurm cluster:
a JAX run as srun's tasks, `mlbench resume` and `scontrol requeue` from a checkpoint, and
`--inject kill` with `--on-failure restart` applied inside the job."""

from __future__ import annotations

import json
import time

import pytest
import torch

from mlbench.launch.registry import launcher_of
from mlbench.results.checkpoints import complete_checkpoints
from mlbench.results.store import RunStore
from tests.helpers import checkpoint, events, last_run, mlbench, run_json, wait_for

JAX_RUN = ("task2a", "2", "--framework", "jax", "--data", "synthetic", "--max-steps", "6",
           "--set", "batch_per_worker=50", "--log-every", "2", "--no-stop", "--seed", "3")


#: a port's two runs (local, then on Slurm) are fresh interpreters importing torch and the
#: framework, about 25 s idle; on the loaded 2-core box beside other tests one took 215 s
PORT_RUNS_TIMEOUT = pytest.mark.timeout(600)


def losses(run) -> list[tuple[int, float]]:
    return [(e["step"], e["value"]) for e in events(run) if e["name"] == "train/loss" and e.get("rank", 0) == 0]


@PORT_RUNS_TIMEOUT
def test_a_jax_run_on_slurm_starts_the_port_and_equals_the_local_run(slurm):
    pytest.importorskip("jax")
    mlbench("run", *JAX_RUN, check=True, timeout=300)
    local = last_run()
    proc = mlbench("run", *JAX_RUN, "--slurm", "--time", "00:10:00", check=True, timeout=300)
    run = last_run()
    assert run.id != local.id and run.launcher == "slurm" and run.state == "finished", proc.stdout + proc.stderr
    assert "-m mlbench.worker.jax_worker" in (run.run_dir / "job.sbatch").read_text()
    assert run_json(run)["config"]["framework"] == "jax"
    assert run.result["steps"] == local.result["steps"] == 6
    assert run.result["final_accuracy"] == local.result["final_accuracy"]
    assert losses(run) == losses(local) and len(losses(run)) == 3


@PORT_RUNS_TIMEOUT
def test_a_two_worker_tensorflow_run_on_slurm_finds_its_peers_and_equals_the_local_run(slurm):
    """Every TensorFlow worker listens on an address of its own: the tasks of the Slurm step derive
    all of them from the step's variables (worker/launcher_env.slurm_peers)."""
    pytest.importorskip("tensorflow")
    tf_run = ("task2a", "2", "--framework", "tensorflow", *JAX_RUN[4:])
    mlbench("run", *tf_run, check=True, timeout=300)
    local = last_run()
    proc = mlbench("run", *tf_run, "--slurm", "--time", "00:10:00", check=True, timeout=300)
    run = last_run()
    assert run.launcher == "slurm" and run.state == "finished", proc.stdout + proc.stderr
    assert "-m mlbench.worker.tf_worker" in (run.run_dir / "job.sbatch").read_text()
    assert run.result["steps"] == local.result["steps"] == 6
    assert run.result["final_accuracy"] == local.result["final_accuracy"]
    assert losses(run) == losses(local) and len(losses(run)) == 3


LONG = ("task2a", "2", "--data", "synthetic", "--set", "batch_per_worker=50", "--log-every", "5", "--no-stop",
        "--set", "max_epochs=100000", "--save-model", "--seed", "3")


def newest_checkpoint(run) -> int:
    return complete_checkpoints(run.run_dir / "checkpoints", run.workers).newest or 0


def test_a_cancelled_slurm_run_resumes_to_the_parameters_of_the_uninterrupted_run(slurm):
    mlbench("run", *LONG, "--max-steps", "100000", "--checkpoint-every", "20steps", "--slurm", "--detach",
            check=True)
    run = last_run()
    first_job = run_json(run)["slurm"]["job_id"]
    wait_for(lambda: newest_checkpoint(run) >= 20, 240, "a checkpoint", 0.5)
    mlbench("cancel", run.id, check=True)
    cap = newest_checkpoint(run) + 10
    proc = mlbench("resume", run.id, "--max-steps", str(cap), check=True, timeout=300)
    assert f"Resuming run {run.id}" in proc.stdout and f"from step {cap - 10}" in proc.stdout
    resumed = RunStore().get(run.id)
    assert resumed.state == "finished" and resumed.result["steps"] == cap, resumed.reason
    document = run_json(resumed)
    assert [(r["from_step"], r["after"]) for r in document["resumes"]] == [(cap - 10, "cancelled")]
    assert document["slurm_earlier_jobs"][0]["job_id"] == first_job != document["slurm"]["job_id"]

    mlbench("run", *LONG, "--max-steps", str(cap), check=True, timeout=300)   # uninterrupted, locally
    reference = last_run()
    for rank in range(2):
        expected, actual = checkpoint(reference, rank), checkpoint(resumed, rank)
        assert all(torch.equal(expected[name], actual[name]) for name in expected), rank


def test_a_requeued_slurm_job_goes_on_from_its_newest_checkpoint_and_fault_clock(slurm):
    # a fault far beyond the test, so that the run keeps a fault clock
    mlbench("run", *LONG, "--max-steps", "100000", "--checkpoint-every", "20steps", "--slurm", "--detach",
            "--inject", "stall:rank=0,at=1h", "--on-failure", "restart:1", check=True)
    run = last_run()
    assert "#SBATCH --requeue" in (run.run_dir / "job.sbatch").read_text()
    wait_for(lambda: newest_checkpoint(run) >= 20, 240, "a checkpoint", 0.5)
    slurm.command("scontrol", "requeue", run_json(run)["slurm"]["job_id"])
    wait_for(lambda: run_json(run).get("resumes"), 240, "the requeued job to resume", 0.5)
    resume = run_json(run)["resumes"][0]
    assert resume["after"] == "requeued" and resume["from_step"] >= 20
    wait_for(lambda: any(e["name"] == "train/loss" and e["time"] > resume["at"] and e["step"] > resume["from_step"]
                         for e in events(run)), 240, "training after the requeue", 0.5)
    assert launcher_of(RunStore(), run).reconcile(RunStore().get(run.id)).state == "running"
    first_clock = run_json(run)["faults"]["clock_s"]   # recorded by the first job's supervisor, on SIGTERM
    assert first_clock > 0
    cancelled_at = time.time()
    mlbench("cancel", run.id, check=True)
    wait_for(lambda: run_json(run)["faults"]["clock_s"] != first_clock, 120, "the second job's fault clock", 0.5)
    # the second job's clock went on from the first's: it ran at least from the resume to the cancel
    assert run_json(run)["faults"]["clock_s"] >= first_clock + (cancelled_at - resume["at"])


def test_a_killed_task_is_restarted_inside_the_job_and_the_run_finishes(slurm):
    # idle, the tasks train about 350 steps a second from about 3 s on: the kill comes mid-run
    mlbench("run", *LONG, "--max-steps", "2000", "--checkpoint-every", "100steps", "--inject", "kill:rank=1,at=5s",
            "--on-failure", "restart:2", "--slurm", check=True, timeout=400)
    run = last_run()
    assert run.state == "finished" and run.result["steps"] == 2000, run.reason
    assert "mlbench.launch.slurm_supervisor" in (run.run_dir / "job.sbatch").read_text()
    faults = json.loads(mlbench("status", run.id, "-o", "json", check=True).stdout)["faults"]
    assert faults["count"] == 1 and faults["restarts"] == 1 and faults["on_failure"] == "restart:2"
    event = faults["events"][0]
    assert (event["kind"], event["rank"], event["at"], event["action"]) == ("kill", 1, 5.0, "restart")
    restart = run_json(run)["faults"]["restarts"][0]
    assert "task 1" in restart["reason"] and "kill of rank 1" in restart["reason"]
    assert restart["from_step"] % 100 == 0 and restart["reached_step"] >= restart["from_step"]
    assert "kill of rank 1 at 5.0 s" in mlbench("status", run.id, check=True).stdout

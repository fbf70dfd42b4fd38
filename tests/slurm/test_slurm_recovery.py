"""Ports, resume and faults of `mlbench run --slurm` against the real one-node Slurm cluster:
the JAX and TensorFlow ports as srun's tasks, `--inject kill` with `--on-failure restart` inside the job,
`scontrol requeue` and `mlbench resume` from a checkpoint, and `--on-failure shrink` to the survivor of a
hung task (the rank its peer's watchdog blamed), applied inside the job."""

from __future__ import annotations

import json
import re
import time

import pytest
import torch

from mlbench.frameworks import get_framework
from mlbench.launch.registry import launcher_of
from mlbench.results.checkpoints import complete_checkpoints
from mlbench.results.store import RunStore
from tests.helpers import checkpoint, events, last_run, mlbench, run_json, skip_unless_installed, wait_for
from tests.shared_runs import PORT_RUN_STEPS, port_run, port_run_args
from tests.slurm.conftest import job_story

#: a port's run on Slurm beside the local one (tests/shared_runs.py: the same run that
#: tests/frameworks checks against one process, made once per session by whichever asks first);
#: the Slurm run is two fresh interpreters importing torch and the framework, about 25 s idle
#: with the local run; on the loaded 2-core box beside other tests one took 215 s
PORT_RUNS_TIMEOUT = pytest.mark.timeout(600)


def losses(run) -> list[tuple[int, int, float]]:
    """Every rank's training losses, by rank and step (the ranks' events interleave as they come)."""
    return sorted((e.get("rank", 0), e["step"], e["value"]) for e in events(run) if e["name"] == "train/loss")


@PORT_RUNS_TIMEOUT
@pytest.mark.parametrize("framework", ["jax", "tensorflow"])
def test_a_two_worker_port_run_on_slurm_finds_its_peers_and_equals_the_local_run(slurm, framework, libsvm_dir,
                                                                                 shared_runs):
    """srun's tasks start the port's worker (the job script names its module); TensorFlow's
    workers each listen on an address of their own, which the tasks of the Slurm step derive from
    the step's variables (worker/launcher_env.slurm_peers); every loss of both ranks and the result
    equal the local run's exactly."""
    skip_unless_installed(framework)
    local = port_run(shared_runs, framework, libsvm_dir).record
    proc = mlbench("run", *port_run_args(framework, libsvm_dir), "--slurm", "--time", "00:10:00",
                   check=True, timeout=300)
    run = last_run()
    assert run.launcher == "slurm" and run.state == "finished", proc.stdout + proc.stderr
    assert f"-m {get_framework(framework).worker} " in (run.run_dir / "job.sbatch").read_text()
    assert run_json(run)["config"]["framework"] == framework
    assert run.result["steps"] == local.result["steps"] == PORT_RUN_STEPS
    assert run.result["final_accuracy"] == local.result["final_accuracy"]
    assert losses(run) == losses(local) and len(losses(run)) == 2 * PORT_RUN_STEPS


LONG = ("task2a", "2", "--data", "synthetic", "--set", "batch_per_worker=50", "--log-every", "5", "--no-stop",
        "--set", "max_epochs=100000", "--save-model", "--seed", "3")


def newest_checkpoint(run) -> int:
    return complete_checkpoints(run.run_dir / "checkpoints", run.workers).newest or 0


#: a Slurm run restarted inside its job, held by a requeue, a resume and a local run: about 50 s
#: idle, 209 s on the loaded 2-core box beside two other workers' tests (before the restart was
#: part of it)
@pytest.mark.timeout(600)
def test_a_restarted_requeued_then_cancelled_slurm_run_resumes_to_the_parameters_of_the_uninterrupted_run(slurm):
    """One run through every way a Slurm job's training stops before its end (one scenario:
    each Slurm run of it costs the loaded CI box a minute): an injected kill of a task, restarted
    inside the job by its supervisor (``--on-failure restart``: a new job step from the newest
    checkpoint); ``scontrol requeue`` (the job goes on by itself from its newest checkpoint and
    fault clock, the kill not done again); and `mlbench cancel` followed by `mlbench resume` (a
    new job). After all three, the parameters equal those of the same run uninterrupted, locally.
    Rank 0 is slowed 20x (it sleeps: the same parameters, step for step): unslowed, the tasks
    trained about 350 steps a second while the test waited, two busy cores, and the local
    reference then had thousands of steps to make again."""
    # the tasks train from about 3 s on: the kill comes mid-run
    mlbench("run", *LONG, "--max-steps", "100000", "--checkpoint-every", "20steps", "--slurm", "--detach",
            "--inject", "slow:rank=0,factor=20", "--inject", "kill:rank=1,at=5s", "--on-failure", "restart:1",
            check=True)
    run = last_run()
    first_job = run_json(run)["slurm"]["job_id"]
    script = (run.run_dir / "job.sbatch").read_text()
    assert "#SBATCH --requeue" in script and "mlbench.launch.slurm_supervisor" in script

    def restarts() -> list:
        return run_json(run).get("faults", {}).get("restarts") or []

    wait_for(lambda: restarts() and restarts()[0].get("recovered_s") is not None, 240, "the restart's recovery", 0.5)
    (restart,) = restarts()
    assert "task 1" in restart["reason"] and "kill of rank 1" in restart["reason"], restart
    assert restart["from_step"] % 20 == 0 and restart["reached_step"] >= restart["from_step"], restart
    # against restart:1 only when the kill came before the group's first checkpoint (restart_counts)
    assert restart["counted"] is (restart["from_step"] == 0), restart
    wait_for(lambda: newest_checkpoint(run) > max(restart["from_step"], 0), 240, "a checkpoint after the restart", 0.5)

    slurm.command("scontrol", "requeue", first_job)
    wait_for(lambda: run_json(run).get("resumes"), 240, "the requeued job to resume", 0.5)
    requeued = run_json(run)["resumes"][0]
    assert requeued["after"] == "requeued" and requeued["from_step"] > restart["from_step"]
    wait_for(lambda: any(e["name"] == "train/loss" and e["time"] > requeued["at"]
                         and e["step"] > requeued["from_step"] for e in events(run)),
             240, "training after the requeue", 0.5)
    assert launcher_of(RunStore(), run).reconcile(RunStore().get(run.id)).state == "running"
    first_clock = run_json(run)["faults"]["clock_s"]   # recorded by the first job's supervisor, on SIGTERM
    assert first_clock > 5
    wait_for(lambda: newest_checkpoint(run) > requeued["from_step"], 240, "a checkpoint after the requeue", 0.5)

    cancelled_at = time.time()
    mlbench("cancel", run.id, check=True)
    wait_for(lambda: run_json(run)["faults"]["clock_s"] != first_clock, 120, "the second job's fault clock", 0.5)
    # the requeued job's clock went on from the first's: it ran at least from the resume to the cancel
    assert run_json(run)["faults"]["clock_s"] >= first_clock + (cancelled_at - requeued["at"])

    cap = newest_checkpoint(run) + 10
    proc = mlbench("resume", run.id, "--max-steps", str(cap), check=True, timeout=300)
    assert f"Resuming run {run.id}" in proc.stdout and f"from step {cap - 10}" in proc.stdout
    resumed = RunStore().get(run.id)
    assert resumed.state == "finished" and resumed.result["steps"] == cap, resumed.reason
    document = run_json(resumed)
    assert [(r["from_step"], r["after"]) for r in document["resumes"]] == [
        (requeued["from_step"], "requeued"), (cap - 10, "cancelled")]
    assert document["slurm_earlier_jobs"][0]["job_id"] == first_job != document["slurm"]["job_id"]
    # the kill, done once (the requeued and the resumed jobs' clocks were past it), as status reads it
    faults = json.loads(mlbench("status", run.id, "-o", "json", check=True).stdout)["faults"]
    (event,) = [e for e in faults["events"] if e["kind"] == "kill"]
    assert faults["restarts"] == 1 and faults["on_failure"] == "restart:1"
    assert (event["kind"], event["rank"], event["at"], event["action"]) == ("kill", 1, 5.0, "restart")
    assert "kill of rank 1 at 5.0 s" in mlbench("status", run.id, check=True).stdout

    mlbench("run", *LONG, "--max-steps", str(cap), check=True, timeout=300)   # uninterrupted, locally
    reference = last_run()
    for rank in range(2):
        expected, actual = checkpoint(reference, rank), checkpoint(resumed, rank)
        assert all(torch.equal(expected[name], actual[name]) for name in expected), rank


@pytest.mark.timeout(600)   # one Slurm job of two steps and a local reference run
def test_a_slurm_run_shrinks_to_the_survivor_of_a_hung_task_as_a_local_run_does(slurm, libsvm_dir):
    """--on-failure shrink inside the job, after a hang (the harder case than a death): task 1
    is stopped (SIGSTOP, by the test while it trains), task 0's watchdog names rank 1 within its
    bound and exits, and srun then names task 0, whose exit ended the step. The supervisor must
    leave out the rank the watchdog blamed, not the task srun named: the next step has one task,
    old rank 0 going on from the newest checkpoint (step N). The reference is test_faults' for a
    local shrink: a two-worker run of N steps (local: a Slurm run equals it, test_a_requeued...),
    then its checkpoint resumed by one worker (in this process) to the same step cap.

    The same job carries an injected stall the run survives (``stall:rank=0,at=1s,for=2s``): the
    job's supervisor stops task 0 once its heartbeat gives its pid (at its start, or a moment
    later in training, where 2 s is far below the 8-s bound) and continues it 2 s later. Its
    event records how long the process was stopped and no action, and it must not be blamed for
    the shrink: a stall that is over explains a failure only through a verdict naming its rank,
    and here the verdict names rank 1 (blamed instead, old rank 1 would go on, stopped).

    Task 1 is slowed 10x (it sleeps nine times its compute after each step; the parameters are the
    same step for step), so that both tasks still train when the test stops it after their 200th
    step, with a cap of 600 steps: at full speed the cap had to be 3,000, and the survivor and the
    reference made the 2,800 steps after the shrink, each (61 s on the loaded box, 23 s idle)."""
    from tests.helpers import assert_survivor_equals_a_one_worker_resume, stop_while_training
    from tests.slurm.test_slurm_runs import worker_pid

    steps = 600
    RUN = ("task2a", "2", "--data-dir", str(libsvm_dir), "--set", "batch_per_worker=50", "--log-every", "5",
           "--no-stop", "--set", "max_epochs=100000", "--checkpoint-every", "10steps")
    mlbench("run", *RUN, "--max-steps", str(steps), "--save-model", "--on-failure", "shrink", "--watchdog", "8s",
            "--inject", "stall:rank=0,at=1s,for=2s", "--inject", "slow:rank=1,factor=10", "--slurm", "--detach",
            check=True)
    run = last_run()
    wait_for(lambda: newest_checkpoint(run) >= 20 and worker_pid(run.run_dir, 1), 180, "both tasks to checkpoint",
             explain=lambda: job_story(slurm, run.run_dir))
    stop_while_training(worker_pid(run.run_dir, 1), run.run_dir, 1)
    wait_for(lambda: not launcher_of(RunStore(), run).reconcile(run).active, 300, "the run to end", interval=1)
    faulty = RunStore().get(run.id)
    assert faulty.state == "finished" and faulty.result["steps"] == steps, faulty.reason
    shrink = run_json(faulty)["faults"]["restarts"][0]
    assert (shrink["workers"], shrink["survivors"]) == (1, [0]), shrink
    assert ": watchdog: rank 1 made no progress for " in shrink["reason"], shrink
    assert "[injected: " not in shrink["reason"], shrink   # the survived stall is not blamed
    (stall,) = [e for e in run_json(faulty)["faults"]["events"] if e["kind"] == "stall"]
    assert (stall["kind"], stall["rank"], stall["at"], stall["for"]) == ("stall", 0, 1.0, 2.0), stall
    assert stall["stopped_s"] >= 2.0 and "missed" not in stall and "action" not in stall, stall
    status = json.loads(mlbench("status", faulty.id, "-o", "json", check=True).stdout)
    assert status["faults"]["workers"] == [2, 1] and status["workers"] == 2 and status["launcher"] == "slurm"
    shown = mlbench("status", faulty.id, check=True).stdout
    assert "2 -> 1" in shown and re.search(r"recovery +1 shrink, \d+ steps lost and redone", shown), shown
    assert re.search(r"faults +2 \(slow of rank 1 at 0\.0 s, stall of rank 0 at 1\.0 s\); on failure: shrink",
                     shown), shown
    out = "".join(p.read_text() for p in (faulty.run_dir / "logs").glob("slurm-*.out"))
    assert f"shrink 1: 1 of 2 worker(s) go on from step {shrink['from_step']} (old rank 0)" in out, out

    n = shrink["from_step"]
    assert 0 < n < steps and n % 10 == 0, shrink
    mlbench("run", *RUN, "--max-steps", str(n), check=True)
    reference = last_run()
    assert reference.launcher == "local"
    assert_survivor_equals_a_one_worker_resume(faulty, reference, n, steps)

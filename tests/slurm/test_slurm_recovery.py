"""Ports, resume and faults of `mlbench run --slurm` against the real one-node Slurm cluster:
a JAX run as srun's tasks, `mlbench resume` and `scontrol requeue` from a checkpoint, and
`--inject kill` with `--on-failure restart` applied inside the job."""

from __future__ import annotations

import pytest

from tests.helpers import events, last_run, mlbench, run_json

JAX_RUN = ("task2a", "2", "--framework", "jax", "--data", "synthetic", "--max-steps", "6",
           "--set", "batch_per_worker=50", "--log-every", "2", "--no-stop", "--seed", "3")


def losses(run) -> list[tuple[int, float]]:
    return [(e["step"], e["value"]) for e in events(run) if e["name"] == "train/loss" and e.get("rank", 0) == 0]


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

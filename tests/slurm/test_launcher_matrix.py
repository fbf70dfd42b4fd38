"""The launcher matrix's Slurm row (tests/launcher_matrix.py) against the real one-node Slurm
cluster: a cancel from the CLI and from the dashboard both ``scancel`` the job (Slurm ends it
CANCELLED, the reason names the scancel, and its workers are gone), and a job's end is seen alike
by `status` and the dashboard. (The cancel from the CLI is also what `mlbench cancel` of a Slurm
run must do: it is tested here only.)"""

from __future__ import annotations

import pytest

from mlbench.launch import slurm_jobs
from mlbench.launch.registry import launcher_of
from mlbench.results.store import RunStore
from tests.helpers import mlbench, run_json
from tests.launcher_matrix import (
    LauncherCase,
    check_cancel_from_the_cli,
    check_cancel_from_the_dashboard,
    check_end_seen_by_status_and_the_dashboard,
)
from tests.slurm.test_slurm_runs import wait_for, worker_pid

ENDLESS = ("task2a", "2", "--data", "synthetic", "--max-steps", "1000000", "--no-stop", "--log-every", "5")
SHORT = ("task2a", "2", "--data", "synthetic", "--max-steps", "4", "--log-every", "2")
ACTIONS = {"cancel-cli": check_cancel_from_the_cli, "cancel-dashboard": check_cancel_from_the_dashboard,
           "end": check_end_seen_by_status_and_the_dashboard}


def _submitted(*args: str) -> str:
    proc = mlbench("run", *args, "--slurm", "--detach", check=True)
    run_id = proc.stdout.split("Started run ")[1].split()[0]
    assert f"as Slurm job {run_json(RunStore().get(run_id))['slurm']['job_id']}" in proc.stdout, proc.stdout
    return run_id


def _endless() -> str:
    """A job that trains until it is cancelled, once both of its workers run (Slurm's word:
    the launcher reconciles it as running)."""
    run_id = _submitted(*ENDLESS)
    run = RunStore().get(run_id)
    wait_for(lambda: worker_pid(run.run_dir, 1) and (run.run_dir / "events" / "rank-0.jsonl").exists(),
             what="the job's workers")
    assert launcher_of(RunStore(), run).reconcile(run).state == "running"
    return run_id


def _job_gone(run_id: str) -> bool:
    """Slurm ended the job (CANCELLED after a cancel: scancel ran) and no worker is left."""
    run = RunStore().get(run_id)
    job = run_json(run)["slurm"]["job_id"]
    state = slurm_jobs.query(job)
    if state is None or state.active:
        return False
    if run.state == "cancelled":
        assert state.state == "CANCELLED" and f"scancel {job}" in run.reason, (state, run.reason)
    return worker_pid(run.run_dir, 0) is None and worker_pid(run.run_dir, 1) is None


@pytest.mark.parametrize("action", list(ACTIONS))
def test_slurm_runs_are_cancelled_with_scancel_and_end_alike_in_the_cli_and_the_dashboard(slurm, action):
    pytest.importorskip("uvicorn", reason="the dashboard needs uvicorn (pip install 'mlbench-suite[dashboard]')")
    case = LauncherCase("slurm", _endless, lambda: _submitted(*SHORT), _job_gone, cancel_reason="scancel")
    ACTIONS[action](case)
    if action == "end":
        assert run_json(RunStore().list()[-1])["nodes"] == 1  # the allocation's node count

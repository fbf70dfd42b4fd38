"""Goodput and its parts, recomputed from a run's own files (docs/faults.md): the wall time of
every start, the training clock at the end, the checkpoint writes on the final trajectory, the
redone steps. Real runs of task 2a through the CLI; each figure `status -o json` gives under
``faults.time`` is computed here again by another route (by wall-clock times, where the product
goes by steps) and must agree.
"""

from __future__ import annotations

import json

import pytest

from mlbench.results.store import RunStore
from tests.helpers import events, mlbench, run_json

RUN = ("task2a", "--data", "synthetic", "--no-stop", "--set", "max_epochs=100000", "--log-every", "25")


def _time(run_id: str) -> dict:
    return json.loads(mlbench("status", run_id, "-o", "json", check=True).stdout)["faults"]["time"]


def _checkpoint_seconds(rank0: list[dict], kept) -> float:
    return sum(e["value"]["seconds"] for e in rank0 if e["name"] == "checkpoint" and kept(e))


def test_checkpoint_writes_are_not_productive_time():
    """Every step checkpointed: the writes are in the training clock, and goodput leaves them out."""
    mlbench("run", *RUN, "1", "--max-steps", "200", "--checkpoint-every", "1steps", check=True)
    run = RunStore().list()[-1]
    rank0 = [e for e in events(run) if e["rank"] == 0]
    wall = run.finished_at - run.started_at
    checkpoints = _checkpoint_seconds(rank0, lambda e: True)
    assert sum(e["name"] == "checkpoint" for e in rank0) == 200
    figures = _time(run.id)
    assert figures["wall_s"] == pytest.approx(wall, abs=2e-3)
    assert figures["train_s"] == pytest.approx(run.result["train_time"], abs=2e-3)
    assert figures["checkpoint_s"] == pytest.approx(checkpoints, abs=2e-3) and checkpoints > 0
    assert figures["goodput"] == pytest.approx((run.result["train_time"] - checkpoints) / wall, abs=1e-3)
    assert figures["goodput"] < run.result["train_time"] / wall


def test_a_resumed_runs_wall_time_is_every_starts_and_a_clean_stop_redoes_nothing():
    mlbench("run", *RUN, "2", "--max-steps", "200", "--checkpoint-every", "100steps", check=True)
    first = RunStore().list()[-1]
    first_wall = first.finished_at - first.started_at
    mlbench("resume", first.id, "--max-steps", "400", check=True)
    run = RunStore().get(first.id)
    document = run_json(run)
    ended = document["resumes"][0]["ended_start"]
    assert (ended["started_at"], ended["finished_at"]) == (first.started_at, first.finished_at)
    wall = first_wall + (run.finished_at - run.started_at)
    rank0 = [e for e in events(run) if e["rank"] == 0]
    resumed_at = document["resumes"][0]["at"]
    # the checkpoint the resume went on from (step 200, written at the stop) was written after
    # its state, and so its clock, was taken: only the ones before it and the resumed start's count
    checkpoints = _checkpoint_seconds(rank0, lambda e: e["time"] > resumed_at or e["value"]["step"] < 200)
    figures = _time(run.id)
    assert figures["starts"] == 2 and figures["redone_steps"] == 0
    assert figures["wall_s"] == pytest.approx(wall, abs=2e-3)
    assert figures["checkpoint_s"] == pytest.approx(checkpoints, abs=2e-3)
    assert figures["goodput"] == pytest.approx((run.result["train_time"] - checkpoints) / wall, abs=1e-3)
    assert figures["goodput"] < run.result["train_time"] / (run.finished_at - run.started_at)


def test_a_restart_redoes_the_steps_past_its_checkpoint_and_their_checkpoints_do_not_count():
    mlbench("run", *RUN, "2", "--max-steps", "6000", "--checkpoint-every", "20steps", "--inject",
            "kill:rank=1,at=2s", "--on-failure", "restart", check=True)
    run = RunStore().list()[-1]
    restart = run_json(run)["faults"]["restarts"][0]
    rank0 = [e for e in events(run) if e["rank"] == 0]
    thrown = lambda e: e["time"] < restart["at"] and e["value"]["step"] >= restart["from_step"]
    checkpoints = _checkpoint_seconds(rank0, lambda e: not thrown(e))
    assert restart["from_step"] > 0 and any(thrown(e) for e in rank0 if e["name"] == "checkpoint")
    figures = _time(run.id)
    assert figures["redone_steps"] == restart["lost_steps"] == restart["reached_step"] - restart["from_step"] > 0
    assert figures["checkpoint_s"] == pytest.approx(checkpoints, abs=2e-3)
    wall = run.finished_at - run.started_at
    assert figures["goodput"] == pytest.approx((run.result["train_time"] - checkpoints) / wall, abs=1e-3)


def test_a_survived_stall_is_stalled_time_not_productive_time():
    """Rank 1 stopped for 1.5 s (SIGSTOP, then SIGCONT; the watchdog's 60 s let it live): every
    rank's training clock runs on through it, and goodput leaves out the stall, as long as its
    process really was stopped (the supervisor's ``stopped_s``, measured from SIGSTOP to SIGCONT)."""
    mlbench("run", *RUN, "2", "--max-steps", "100000", "--time-budget", "6s", "--inject",
            "stall:rank=1,at=3s,for=1.5s", "--inject", "slow:rank=0,factor=3", check=True)
    run = RunStore().list()[-1]
    (stall,) = [e for e in run_json(run)["faults"]["events"] if e["kind"] == "stall"]
    assert "missed" not in stall and stall["stopped_s"] == pytest.approx(1.5, abs=0.3), stall
    figures = _time(run.id)
    assert figures["stalled_s"] == pytest.approx(stall["stopped_s"], abs=0.3)
    wall = run.finished_at - run.started_at
    productive = run.result["train_time"] - stall["stopped_s"]
    assert figures["goodput"] == pytest.approx(productive / wall, abs=0.3 / wall)
    assert figures["goodput"] < run.result["train_time"] / wall


def test_a_shrink_redoes_the_steps_past_its_checkpoint_and_its_wall_time_is_the_runs():
    mlbench("run", *RUN, "2", "--max-steps", "4000", "--checkpoint-every", "20steps", "--inject",
            "kill:rank=1,at=2s", "--inject", "slow:rank=0,factor=2", "--on-failure", "shrink", check=True)
    run = RunStore().list()[-1]
    (shrink,) = run_json(run)["faults"]["restarts"]
    assert shrink["survivors"] == [0] and shrink["from_step"] > 0, shrink
    rank0 = [e for e in events(run) if e["rank"] == 0]
    thrown = lambda e: e["time"] < shrink["at"] and e["value"]["step"] >= shrink["from_step"]
    checkpoints = _checkpoint_seconds(rank0, lambda e: not thrown(e))
    # the steps redone: the last step rank 0 logged before the shrink, past the checkpoint (the
    # product counts them from the heartbeats at the kill, so it may count a few more)
    logged = max(e["step"] for e in rank0 if e["name"] == "train/steps" and e["time"] < shrink["at"])
    figures = _time(run.id)
    assert figures["redone_steps"] == shrink["lost_steps"] >= max(0, logged - shrink["from_step"])
    assert figures["checkpoint_s"] == pytest.approx(checkpoints, abs=2e-3)
    wall = run.finished_at - run.started_at
    assert figures["wall_s"] == pytest.approx(wall, abs=2e-3)
    assert figures["goodput"] == pytest.approx((run.result["train_time"] - checkpoints) / wall, abs=1e-3)


def test_a_sweep_of_task0a_has_no_goodput_since_it_trains_nothing():
    """Task 0a measures the all-reduce: no step of it trains, so no surface shows a goodput
    (`status RUN` showed 93.7% beside 0.0 s of training)."""
    mlbench("run", "task0a", "2", "--max-size", "1e4", check=True)
    run = RunStore().list()[-1]
    assert run.state == "finished" and run.result["kind"] == "allreduce", run.reason
    status = json.loads(mlbench("status", run.id, "-o", "json", check=True).stdout)
    assert (status["faults"]["goodput"], status["faults"]["time"]) == (None, None)
    assert "goodput" not in mlbench("status", run.id, check=True).stdout

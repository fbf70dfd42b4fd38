"""The recovery state machine every supervisor shares (mlbench.launch.recovery, docs/faults.md):
its back-off, faults due during a restart recorded as missed, and several ranks that fail at
one moment handled as one failure. The machine is driven by hand on a real run folder with
real processes (``sleep``) as its workers; the same rules are then checked on real runs of 2
and 3 workers under the local supervisor.
"""

from __future__ import annotations

import json
import math
import subprocess
import time

import pytest

from mlbench.launch.faults import parse_inject
from mlbench.results.checkpoints import rank_file
from mlbench.run_config import RunDocument
from tests.helpers import last_run, mlbench, run_json

pytestmark = pytest.mark.ram_home


def finished_run(libsvm_dir, workers: int, steps: int, *options: str) -> tuple:
    """A task2a run of ``workers`` to ``steps`` steps with ``options``, finished: it and its faults."""
    mlbench("run", "task2a", str(workers), "--data-dir", str(libsvm_dir), *OPTIONS, "--max-steps", str(steps),
            *options, check=True)
    run = last_run()
    assert run.state == "finished" and run.result["steps"] == steps, run.reason
    return run, run_json(run)["faults"]


def mllog(run, tmp_path) -> list[dict]:
    """The run's MLPerf log records (`mlbench download --format mlperf`), in order."""
    from mlbench.results.mllog import TOKEN, write_mllog

    path = write_mllog(run, tmp_path / f"{run.id}.mllog.txt")
    return [json.loads(line[len(TOKEN):]) for line in path.read_text().splitlines()]

OPTIONS = ("--set", "batch_per_worker=50", "--log-every", "5", "--no-stop", "--set", "max_epochs=100000")


def test_the_back_off_doubles_for_each_restart_in_a_row_without_progress_and_is_none_after_progress():
    from mlbench.launch.recovery import BACKOFF_FIRST_S, BACKOFF_MAX_S, backoff_s

    stuck, moved = {"progressed": False}, {"progressed": True}
    assert backoff_s([], progressed=True) == 0.0
    assert backoff_s([], progressed=False) == BACKOFF_FIRST_S
    assert backoff_s([stuck], progressed=False) == 2 * BACKOFF_FIRST_S
    assert backoff_s([stuck, moved, stuck, stuck], progressed=False) == 4 * BACKOFF_FIRST_S
    assert backoff_s([stuck] * 40, progressed=False) == BACKOFF_MAX_S
    assert backoff_s([stuck] * 40, progressed=True) == 0.0
    assert backoff_s([{}], progressed=False) == BACKOFF_FIRST_S   # an entry from before: it progressed


def test_the_machine_backs_off_records_a_fault_due_in_a_restart_as_missed_and_goes_on_after_progress():
    from mlbench.launch.recovery import BACKING_OFF, ENDING, RECOVERING, RUNNING, Recovery
    from mlbench.results.heartbeat import Beat, write_beat

    mlbench("run", "task2a", "2", "--data", "synthetic", "--record-only", check=True)
    run_dir = last_run().run_dir
    document = RunDocument.load(run_dir)   # as a run of this machine with these options records them
    document.config.faults = [parse_inject(text) for text in (
        "kill:rank=1,at=0s", "kill:rank=0,at=0.5s", "kill:rank=0,at=1.2s", "kill:rank=0,at=2.2s")]
    document.config.on_failure, document.config.max_restarts = "restart", 5
    document.save(run_dir)
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    try:
        recovery = Recovery(run_dir)
        start = recovery.start_clock()

        def until(moment: float) -> None:   # on the fault clock
            time.sleep(max(0.0, start + moment - time.time()))

        recovery.tick(procs)   # moment 0 of rank 1's kill; rank 0's first is at 0.5 s
        assert procs[1].wait(timeout=10) == -9 and procs[0].poll() is None
        decision = recovery.failure([1], "worker 1 was killed by SIGKILL", codes={1: -9})
        assert (decision.action, decision.ranks, decision.progressed, decision.backoff_s) == (
            "restart", [1], False, 1.0)
        assert recovery.state == ENDING and "[injected: kill of rank 1 at 0.0 s" in decision.reason
        procs[0].kill()
        procs[0].wait()
        until(0.6)
        recovery.tick(procs)   # rank 0's moment at 0.5 s: due while the group ends
        entry = recovery.group_ended()
        assert recovery.state == BACKING_OFF and not recovery.may_start()
        assert (entry["ranks"], entry["faults"], entry["backoff_s"], entry["progressed"]) == ([1], [0], 1.0, False)
        assert "in 1s (no progress since the last start)" in recovery.line(entry)
        until(1.3)
        recovery.tick([])   # due while backing off (until about 1.6 s)
        while not recovery.may_start():
            time.sleep(0.05)
        procs = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
        recovery.started()
        assert recovery.state == RECOVERING
        until(2.3)
        recovery.tick(procs)   # due while the new group is not back yet
        assert all(p.poll() is None for p in procs)   # nothing struck it
        events = json.loads((run_dir / "run.json").read_text())["faults"]["events"]
        assert [e["rank"] for e in events] == [1, 0, 0, 0] and "missed" not in events[0]
        assert [e["missed"].split(" (")[1] for e in events[1:]] == ["ending)", "backing off)", "recovering)"]
        assert all(e["missed"].startswith("due during the recovery from failure 1") for e in events[1:])

        now = time.time()
        for rank in range(2):   # every rank past the checkpoint (step 0): back
            write_beat(run_dir, Beat(rank=rank, time=now, started=now, step=3, stepped_at=now,
                                     median_step_s=0.01, phase="training"))
        recovery.tick(procs)
        assert recovery.state == RUNNING
        assert json.loads((run_dir / "run.json").read_text())["faults"]["restarts"][0]["recovered_s"] > 1.0

        # the new group wrote a complete checkpoint past its start: its failure restarts at once
        document = RunDocument.load(run_dir)
        for rank in range(2):
            path = rank_file(run_dir / "checkpoints", 10, rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"state")
        assert document.config.resume_step in (None, 0)
        again = recovery.failure([0], "worker 0 was killed by SIGKILL", codes={0: -9})
        assert (again.progressed, again.backoff_s) == (True, 0.0)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_two_ranks_killed_at_one_moment_are_one_failure_and_a_shrink_leaves_both_out(libsvm_dir, tmp_path):
    """3 workers, ranks 1 and 2 killed at 4 s: one failure naming both, one shrink to rank 0 alone
    (before, rank 1's death was handled alone and the killed rank 2 went on as a 'survivor').
    Rank 0 is slowed 4x (it sleeps three times its compute after each step), so that the run
    lasts past 4 s on an idle machine too."""
    run, faults = finished_run(libsvm_dir, 3, 3000, "--checkpoint-every", "10steps", "--inject", "kill:rank=1,at=4s",
                               "--inject", "kill:rank=2,at=4s", "--inject", "slow:rank=0,factor=4",
                               "--on-failure", "shrink")
    (shrink,) = faults["restarts"]
    assert (shrink["survivors"], shrink["workers"]) == ([0], 1), shrink
    kills = [i for i, e in enumerate(faults["events"]) if e["kind"] == "kill"]
    assert (shrink["ranks"], shrink["faults"]) == ([1, 2], kills) and len(kills) == 2
    assert "kill of rank 1 at 4.0 s" in shrink["reason"] and "kill of rank 2 at 4.0 s" in shrink["reason"]
    killed = [faults["events"][i] for i in kills]
    assert [e["action"] for e in killed] == ["shrink", "shrink"]
    assert all(e["lost_steps"] == shrink["lost_steps"] and "recovered_s" in e for e in killed)
    status = json.loads(mlbench("status", run.id, "-o", "json", check=True).stdout)
    assert status["faults"]["workers"] == [3, 1]
    # the epochs trained: whole epochs of 13 steps of 3 x 50 examples (of 2,000) up to the
    # shrink's checkpoint, then its epoch's batch b goes on as batch 3b of 40 steps of one worker;
    # by the steps at the last size alone it would be 3,000 / 40 = 75
    epoch, batch = divmod(shrink["from_step"], 2000 // 150)
    trained = epoch + (3 * batch + 3000 - shrink["from_step"]) / (2000 // 50)
    assert run.result["epochs"] == pytest.approx(trained), (run.result["epochs"], trained)
    # its MLPerf log: every size it trained at, the shrink at its moment, samples at each size's batch
    records = mllog(run, tmp_path)
    (workers,) = [r for r in records if r["key"] == "number_of_workers"]
    assert (workers["value"], workers["metadata"]) == (3, {"sizes": [3, 1]})
    (logged,) = [r for r in records if r["key"] == "mlbench_shrink"]
    assert logged["value"] == shrink["from_step"] and logged["metadata"]["ranks"] == [1, 2]
    assert (logged["metadata"]["workers"], logged["metadata"]["global_batch_size"]) == (1, 50)
    last = [r for r in records if r["key"] == "eval_accuracy"][-1]["metadata"]
    assert last["samples_count"] == 150 * shrink["from_step"] + 50 * (3000 - shrink["from_step"])
    assert last["epoch_num"] == math.ceil(round(run.result["epochs"], 6))
    platform = next(r["value"] for r in records if r["key"] == "submission_platform")
    assert "3 -> 1 worker(s)" in platform


def test_a_kill_due_while_a_restart_is_under_way_is_recorded_as_missed(libsvm_dir, tmp_path):
    """Rank 1 killed at 4 s before any checkpoint: the group made no progress, so its restart
    (from step 0) waits a second's back-off; rank 0's kill at 5 s falls in that restart and is
    recorded as missed, not struck on the new group (before, it was a second restart). Rank 1 is
    slowed 3x, so that the run lasts past 5 s on an idle machine too."""
    run, faults = finished_run(libsvm_dir, 2, 1500, "--checkpoint-every", "100000steps",
                               "--inject", "kill:rank=1,at=4s", "--inject", "kill:rank=0,at=5s",
                               "--inject", "slow:rank=1,factor=3", "--on-failure", "restart:3")
    (restart,) = faults["restarts"]
    assert (restart["ranks"], restart["from_step"], restart["progressed"], restart["backoff_s"]) == ([1], 0, False, 1.0)
    assert restart["recovered_s"] >= 1.0
    first, second = [e for e in faults["events"] if e["kind"] == "kill"]
    assert first["action"] == "restart" and "action" not in second
    assert second["missed"].startswith("due during the recovery from failure 1"), second
    # its MLPerf log: the epochs of the final trajectory once each (the restart went back to step 0
    # after several epochs), and the restart at its moment
    records = mllog(run, tmp_path)
    epochs = [r["metadata"]["epoch_num"] for r in records if r["key"] == "eval_accuracy"]
    assert epochs == list(range(1, len(epochs) + 1)) and epochs[-1] == math.ceil(round(run.result["epochs"], 6))
    (logged,) = [r for r in records if r["key"] == "mlbench_restart"]
    assert logged["value"] == 0 and logged["metadata"]["ranks"] == [1]
    assert logged["time_ms"] == round(restart["at"] * 1000)


def test_a_failure_names_every_rank_a_kill_struck_before_it_was_seen(tmp_path):
    """FaultRecord.blame_all: a kill struck on rank 2 that no failure answered yet is part of rank
    1's failure (its worker cannot go on); a survived stall of another rank is not."""
    from mlbench.launch.injector import FaultRecord

    mlbench("run", "task2a", "3", "--data", "synthetic", "--record-only", check=True)
    run_dir = last_run().run_dir
    record = FaultRecord(run_dir)
    now = time.time()
    record.events = [
        {"kind": "stall", "rank": 0, "at": 1.0, "time": now - 3, "schedule": "stall:rank=0,at=1s,for=1s",
         "stopped_s": 1.0},
        {"kind": "kill", "rank": 1, "at": 2.0, "time": now - 1, "schedule": parse_inject("kill:rank=1,at=2s")["text"]},
        {"kind": "kill", "rank": 2, "at": 2.0, "time": now - 1, "schedule": parse_inject("kill:rank=2,at=2s")["text"]},
    ]
    reason, faults = record.blame_all([1], "worker 1 was killed by SIGKILL", now)
    assert [(f["kind"], f["rank"]) for f in faults] == [("kill", 1), ("kill", 2)]
    assert reason == ("worker 1 was killed by SIGKILL [injected: kill of rank 1 at 2.0 s, --inject kill:rank=1,at=2s; "
                      "kill of rank 2 at 2.0 s, --inject kill:rank=2,at=2s]")
    assert all(f["detected_s"] == 1.0 for f in faults)

"""`mlbench run --inject ... --on-failure ...` (docs/faults.md): faults applied for real to 2 real
workers by the local supervisor, the restart policy, and what status says they cost.

A kill with a restart from checkpoints written every step ends with the very parameters
(torch.equal) of the same run uninterrupted; a SIGSTOPped worker is found by the watchdog and
the group restarted; a slowed rank is named the straggler; the fail policy fails naming the
fault. The schedules themselves (seeded random intervals, windows) are checked in-process.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from mlbench.errors import UsageError
from mlbench.launch.faults import parse_inject, parse_on_failure
from mlbench.results.faults import slow_factor, start_times
from mlbench.results.store import RunStore
from tests.helpers import assert_survivor_equals_a_one_worker_resume, checkpoint, mlbench, run_json

#: their runs checkpoint every 1 to 50 steps, each fsync'ed: on the loaded box's disk that
#: was most of their time (tests/conftest.py isolated_home)
pytestmark = pytest.mark.ram_home

OPTIONS = ("--set", "batch_per_worker=50", "--log-every", "5", "--no-stop", "--set", "max_epochs=100000")


def _status(run_id: str) -> dict:
    return json.loads(mlbench("status", run_id, "-o", "json", check=True).stdout)


def test_the_recovery_rule_of_every_supervisor():
    """The local supervisor, the one inside a Slurm job and the cluster's decide alike
    (injector.next_group): restart while restarts that count are left, or when this one does
    not count (an injected fault after a new checkpoint), shrink while shrinks and survivors
    are, else give up with the words the failure's reason gets. An entry recorded before
    ``counted`` existed counts."""
    from mlbench.launch.injector import next_group

    counted, free = {"counted": True}, {"counted": False}
    assert next_group("restart", 2, [counted], 2, (1,)) == (None, None)
    assert next_group("restart", 2, [counted, {}], 2, (1,)) == (
        None, " (after 2 restarts, the most --on-failure allowed)")
    assert next_group("restart", 2, [free, free, counted, free], 2, (1,)) == (None, None)
    assert next_group("restart", 1, [free, counted, free], 2, (1,)) == (
        None, " (after 1 restart, the most --on-failure allowed, besides 2 after injected faults, which do not count)")
    assert next_group("restart", 1, [counted], 2, (1,), counts=False) == (None, None)
    assert next_group("fail", 0, [], 2, (1,)) == (None, "")
    assert next_group("fail", 0, [], 2, (1,), counts=False) == (None, "")
    assert next_group("shrink", 0, [{}] * 3, 4, (2,)) == ([0, 1, 3], None)
    assert next_group("shrink", 1, [{}], 3, (0,), counts=False) == (
        None, " (after 1 shrink, the most --on-failure allowed)")
    assert next_group("shrink", 0, [], 1, (0,)) == (None, " (no worker left to shrink to)")


def test_an_injected_fault_counts_against_the_restarts_only_when_no_checkpoint_came_since_the_groups_start(
        tmp_path):
    """injector.restart_counts: the step the group started from (run.json's resume_step)
    against its newest complete checkpoint (every rank's file of a step)."""
    from mlbench.launch.injector import restart_counts
    from mlbench.launch.plan import RunRequest, build_config
    from mlbench.results.checkpoints import rank_file
    from mlbench.run_config import RunDocument

    config, _ = build_config(RunRequest(task="task2a", workers=2, data="synthetic"))
    document = RunDocument(task="task2a", config=config)
    document.save(tmp_path)
    kill = {"kind": "kill", "rank": 1}
    assert restart_counts(tmp_path, 2, None) and restart_counts(tmp_path, 2, kill)   # no checkpoint yet

    def write(step: int, ranks: range) -> None:
        for rank in ranks:
            path = rank_file(tmp_path / "checkpoints", step, rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"state")

    write(50, range(1))   # rank 1's file of step 50 is missing: no complete checkpoint
    assert restart_counts(tmp_path, 2, kill)
    write(50, range(2))
    assert not restart_counts(tmp_path, 2, kill) and restart_counts(tmp_path, 2, None)
    document.config.resume_step = 50   # the group started from it: nothing new since
    document.save(tmp_path)
    assert restart_counts(tmp_path, 2, kill)
    write(100, range(2))
    assert not restart_counts(tmp_path, 2, kill)


def test_schedules_repeat_exactly_and_bad_ones_are_refused_in_one_line(libsvm_dir):
    spec = parse_inject("kill:rank=1,every=rand(60s,120s),seed=3")
    times = start_times(spec, 600)
    assert times == start_times(parse_inject("kill:rank=1,every=rand(60s,120s),seed=3"), 600)
    assert all(60 <= b - a <= 120 for a, b in zip([0.0, *times], times)) and len(times) >= 4
    assert times != start_times(parse_inject("kill:rank=1,every=rand(60s,120s),seed=4"), 600)
    assert start_times(parse_inject("stall:rank=0,every=30s,for=5s"), 100) == [30.0, 60.0, 90.0]
    assert start_times(parse_inject("kill:rank=0,at=2m"), 1000) == [120.0]
    slow = [parse_inject("slow:rank=1,at=10s,for=5s,factor=3")]
    assert [slow_factor(slow, 1, t) for t in (9.9, 10.0, 14.9, 15.0)] == [1.0, 3.0, 3.0, 1.0]
    assert slow_factor(slow, 0, 12) == 1.0 and slow_factor([parse_inject("slow:rank=0,factor=2")], 0, 1e6) == 2.0
    assert parse_on_failure("restart") == ("restart", 3) and parse_on_failure("restart:5") == ("restart", 5)
    assert parse_on_failure("shrink") == ("shrink", 0) and parse_on_failure("shrink:2") == ("shrink", 2)
    for bad in ("kill:rank=1", "boom:rank=1,at=1s", "kill:at=1s", "kill:rank=1,at=1s,factor=2", "slow:rank=0",
                "slow:rank=0,factor=0.5", "stall:rank=0,every=rand(9s,2s)", "kill:rank=0,at=1s,seed=2",
                "link-down:rank=1,at=1s"):
        with pytest.raises(UsageError):
            parse_inject(bad)
    for args in (("--inject", "kill:rank=2,at=1s"), ("--on-failure", "shrink:2"), ("--on-failure", "grow"),
                 ("--on-failure", "shrink", "--optimizer", "powersgd"), ("--inject", "kill:rank=x,at=1s"),
                 ("--inject", "link-down:rank=1,at=1s,for=2s")):
        proc = mlbench("run", "task2a", "2", "--data-dir", str(libsvm_dir), *args)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "Traceback" not in proc.stderr
    assert RunStore().list() == []


def test_the_steps_a_killed_worker_made_after_its_last_heartbeat_count_as_lost(tmp_path):
    """Heartbeats come once a second: a worker at 4 ms a step killed 0.4 s after its last one had
    made about 100 more steps, lost with it. A failure without a known time (a hang) counts the
    heartbeats' own steps; an evaluating worker made no training steps since."""
    from mlbench.launch.injector import reached_step
    from mlbench.results.heartbeat import Beat, write_beat

    write_beat(tmp_path, Beat(rank=0, time=100.0, started=90.0, step=1926, stepped_at=100.0, median_step_s=0.004,
                              phase="training"))
    write_beat(tmp_path, Beat(rank=1, time=100.2, started=90.0, step=1900, stepped_at=99.0, median_step_s=0.004,
                              phase="evaluation"))
    assert reached_step(tmp_path, 2, failed_at=100.4) == 1926 + 100
    assert reached_step(tmp_path, 2) == 1926


def test_a_worker_killed_twice_restarted_from_checkpoints_of_every_step_ends_with_the_uninterrupted_parameters(
        libsvm_dir):
    """Two kills, more than ``restart:1`` allows, and the run still finishes: an injected kill
    after a new checkpoint does not count against N (injector.restart_counts), so a schedule of
    kills is the experiment, not a failure of the run. Each kill must fall after the group's
    first checkpoint, which idle comes about half a second after the ranks' start (on the loaded
    box with four test workers, 1.5 s of the fault clock came before the first step; with a
    benchmark beside the loaded suite, a kill at 3 s fell before it, and the restart was from
    step 0: hence 5 s); the second after the first restart has recovered, about a second idle (a
    kill due while no rank 1 runs is missed; 12 s leaves the restart 7); and the run must outlast
    the second. So the run ends by a time budget of 16 s of
    training (restored from each checkpoint, so a restart's gap and redone steps do not count),
    whatever the machine's speed: by a step cap it ended between its two kills in a one-process
    idle session, and took 126 s on the loaded box when rank 0 was slowed enough to last idle.
    Rank 0 is slowed 10x (it sleeps nine times its compute after each step; the parameters are
    the same step for step), so that the run makes a few hundred steps, a checkpoint at each,
    not thousands. The parameters are those of the uninterrupted run of as many steps."""
    RUN = ("task2a", "2", "--data-dir", str(libsvm_dir), *OPTIONS, "--save-model")
    mlbench("run", *RUN, "--max-steps", "100000", "--time-budget", "16s", "--checkpoint-every", "1steps",
            "--inject", "kill:rank=1,at=5s", "--inject", "kill:rank=1,at=12s", "--inject", "slow:rank=0,factor=10",
            "--on-failure", "restart:1", check=True)
    faulty = RunStore().list()[-1]
    steps = faulty.result["steps"]
    assert faulty.state == "finished" and faulty.result["stop_reason"] == "time-budget" and steps > 0, faulty.result
    faults = _status(faulty.id)["faults"]
    assert faults["restarts"] == 2 and faults["on_failure"] == "restart:1", faults
    kills = [e for e in faults["events"] if e["kind"] == "kill"]
    assert [(e["rank"], e["at"], e["action"]) for e in kills] == [(1, 5.0, "restart"), (1, 12.0, "restart")], kills
    assert all(0 <= e["detected_s"] < 5 for e in kills) and len(faults["recover_s"]) == 2, faults
    assert 0 < faults["goodput"] <= 1
    restarts = run_json(faulty)["faults"]["restarts"]
    restart = restarts[0]
    assert "worker 1 was killed by SIGKILL" in restart["reason"] and "kill of rank 1" in restart["reason"]
    assert restart["reached_step"] >= restart["from_step"] > 0 and restart["counted"] is False, restart
    assert [r["counted"] for r in restarts].count(True) <= 1, restarts   # else restart:1 had failed the run
    assert _status(faulty.id)["summary"]["steps"] == steps   # the steps before each kill counted once
    table = mlbench("status", faulty.id, check=True).stdout
    free = faults["restarts_not_counted"]
    assert free >= 1 and "kill of rank 1 at 5.0 s" in table and "goodput" in table
    assert f"{faults['restarts']} restarts ({free} after injected faults, not counted against restart:1), " in table
    from mlbench.dashboard.views import run_spec  # the dashboard's run page: the same rows
    from mlbench.results.events import read_run_events
    from mlbench.results.summary import summarize
    rows = dict(run_spec(faulty, run_json(faulty), summarize(read_run_events(faulty.run_dir)))["faults"])
    assert rows["faults"] in table and rows["recovery"] in table and rows["goodput"] in table

    mlbench("run", *RUN, "--max-steps", str(steps), check=True)
    reference = RunStore().list()[-1]
    assert reference.result["steps"] == steps
    for rank in range(2):
        expected, actual = checkpoint(reference, rank), checkpoint(faulty, rank)
        assert all(torch.equal(expected[name], actual[name]) for name in expected), rank


def test_a_stalled_worker_is_found_by_the_watchdog_and_the_group_restarted(libsvm_dir):
    """The stall comes at 4 s, inside training on the loaded box too: at 1 s it fell there in the
    ranks' start, judged by the startup bound (50 s, ten times the watchdog's 5 s), and the test
    took 64 s instead of 9. The run ends by a time budget of 8 s of training, not a step cap, so
    that it outlasts the stall whatever the machine's speed; rank 0 is slowed 10x, so that its
    steps cost little CPU while the clock runs (as in the test above). A batch of 5 makes an
    epoch 200 steps, not 20, so that the stall seldom falls in an epoch's evaluation either,
    which the startup bound judges too (a loaded run of the suite took 61 s again at 4 s)."""
    mlbench("run", "task2a", "2", "--data-dir", str(libsvm_dir), *OPTIONS, "--set", "batch_per_worker=5",
            "--max-steps", "100000", "--time-budget", "8s", "--checkpoint-every", "50steps", "--watchdog", "5s",
            "--inject", "slow:rank=0,factor=10", "--inject", "stall:rank=1,at=4s", "--on-failure", "restart:1",
            check=True)
    run = RunStore().list()[-1]
    assert run.state == "finished" and run.result["stop_reason"] == "time-budget", run.result
    faults = _status(run.id)["faults"]
    (event,) = [e for e in faults["events"] if e["kind"] == "stall"]
    assert (event["rank"], event["at"], event["action"]) == (1, 4.0, "restart"), event
    assert event["detected_s"] >= 4   # the watchdog's 5 s bound, from a heartbeat up to 1 s before the stop
    assert "rank 1 made no progress" in run_json(run)["faults"]["restarts"][0]["reason"]


def test_a_slowed_rank_is_named_the_straggler(libsvm_dir):
    mlbench("run", "task2a", "2", "--data-dir", str(libsvm_dir), *OPTIONS, "--max-steps", "60",
            "--inject", "slow:rank=1,factor=4", check=True)
    run = RunStore().list()[-1]
    assert run.state == "finished"
    spread = _status(run.id)["faults"]["stragglers"]
    assert spread["slowest_rank"] == 1 and spread["spread"] > 1.5
    assert "rank 1 slowest" in mlbench("status", run.id, check=True).stdout
    assert run_json(run)["faults"]["events"][0]["kind"] == "slow"


def test_the_fail_policy_fails_naming_the_fault(libsvm_dir):
    proc = mlbench("run", "task2a", "2", "--data-dir", str(libsvm_dir), *OPTIONS,
                   "--max-steps", "100000", "--inject", "kill:rank=0,at=1s")
    assert proc.returncode != 0
    run = RunStore().list()[-1]
    assert run.state == "failed"
    assert "worker 0 was killed by SIGKILL" in run.reason and "injected: kill of rank 0 at 1.0 s" in run.reason
    assert _status(run.id)["faults"]["events"][0]["action"] == "fail"


def test_the_survivor_of_a_shrink_ends_with_the_parameters_of_the_two_worker_run_then_a_one_worker_resume(
        libsvm_dir):
    # 2 workers, rank 1 killed: rank 0 goes on alone from the newest checkpoint (step N). The
    # reference: a 2-worker run of N steps without faults, then its checkpoint resumed by one
    # worker (in this process) to the same step cap; both train at the 1-worker rate rule and
    # start at the same place in the epoch (docs/faults.md's rules for the new size).
    from mlbench.worker.trainer import resumed_batch

    assert [resumed_batch(b, 2, 1) for b in (0, 3, 19)] == [0, 6, 38]
    assert [resumed_batch(b, 4, 3) for b in (0, 1, 3, 4)] == [0, 2, 4, 6] and resumed_batch(7, 3, 3) == 7
    # the kill must fall after the first checkpoint (step 10) and before the end: idle, the
    # ranks make about 350 steps a second from about half a second on (the kill near step
    # 1,200); on the loaded box with four test workers, 1.5 s had come before step 10
    steps = 3000
    RUN = ("task2a", "2", "--data-dir", str(libsvm_dir), *OPTIONS, "--checkpoint-every", "10steps")
    mlbench("run", *RUN, "--max-steps", str(steps), "--save-model", "--inject", "kill:rank=1,at=4s",
            "--on-failure", "shrink", check=True)
    faulty = RunStore().list()[-1]
    assert faulty.state == "finished" and faulty.result["steps"] == steps
    shrink = run_json(faulty)["faults"]["restarts"][0]
    assert (shrink["workers"], shrink["survivors"]) == (1, [0])
    status = _status(faulty.id)
    assert status["faults"]["workers"] == [2, 1] and status["workers"] == 2
    assert status["faults"]["events"][0]["action"] == "shrink"
    shown = mlbench("status", faulty.id, check=True).stdout
    assert "2 -> 1" in shown and re.search(r"recovery +1 shrink, \d+ steps lost and redone", shown), shown
    assert "2 -> 1" in mlbench("status", check=True).stdout
    compared = json.loads(mlbench("compare", "--task", "task2a", "-o", "json", check=True).stdout)
    assert [g["workers_text"] for f in compared["families"] for g in f["groups"]] == ["2 -> 1"]
    from mlbench.dashboard.views import run_spec
    from mlbench.results.events import read_run_events
    from mlbench.results.summary import summarize
    assert run_spec(faulty, run_json(faulty), summarize(read_run_events(faulty.run_dir)))["workers_text"] == "2 -> 1"

    n = shrink["from_step"]
    assert 0 < n < steps and n % 10 == 0, shrink
    mlbench("run", *RUN, "--max-steps", str(n), check=True)
    reference = RunStore().list()[-1]
    assert_survivor_equals_a_one_worker_resume(faulty, reference, n, steps)


def test_a_supervisor_started_again_without_its_clock_strikes_no_moment_twice_a_straggler_at_0_included():
    """A supervisor that was killed records no clock (a cluster's, when the results service's pod
    is replaced): the next goes on from the latest fault's moment, struck then, even when that is
    a straggler's 0.0 (seen on the real node: status counted its slow twice); a run whose clock
    never ran strikes from 0."""
    import time

    from mlbench.launch.injector import FaultRecord, Injector
    from tests.helpers import last_run

    mlbench("run", "task2a", "2", "--data", "synthetic", "--record-only", check=True)
    run_dir = last_run().run_dir
    assert FaultRecord(run_dir).clock_so_far() is None
    schedules = [parse_inject("slow:rank=1,factor=4"), parse_inject("kill:rank=0,at=1000s")]
    (slow,) = Injector(schedules, time.time(), FaultRecord(run_dir), passed=None).apply([])
    assert (slow["kind"], slow["rank"], slow["at"]) == ("slow", 1, 0.0)
    record = FaultRecord(run_dir)   # the first supervisor is gone without recording its clock
    assert record.clock_s is None and record.clock_so_far() == 0.0
    assert Injector(schedules, time.time(), record, passed=record.clock_so_far()).apply([]) == []
    assert FaultRecord(run_dir).events == [slow]


def test_a_resumed_run_goes_on_on_the_fault_clock_where_its_stop_left_it():
    """The stopped supervisor records the clock's seconds (``faults.clock_s``); the resumed one
    goes on from them: a moment already passed is not struck again, one beyond the stop is struck
    once, on the continued clock. The first segment's record is set to 999.8 s (a long first
    segment, without waiting for one) so that ``at=1000s`` falls just after the resume."""
    RUN = ("task2a", "2", "--data", "synthetic", "--set", "batch_per_worker=50", "--checkpoint-every", "2steps",
           "--inject", "slow:rank=0,every=0.1s,for=0.1s,factor=1.5",
           "--inject", "slow:rank=1,at=1000s,for=0.1s,factor=1.5")
    mlbench("run", *RUN, "--max-steps", "2", check=True)
    run = RunStore().list()[-1]
    document = run_json(run)
    first = document["faults"]["events"]
    assert 0 < document["faults"]["clock_s"] < 1000
    assert first and all(e["rank"] == 0 for e in first)   # the first segment lasts a few tenths
    document["faults"]["clock_s"] = 999.8
    (run.run_dir / "run.json").write_text(json.dumps(document))

    mlbench("resume", run.id, "--max-steps", "6", check=True)
    document = run_json(RunStore().get(run.id))
    events, resumed_at = document["faults"]["events"], document["resumes"][0]["at"]
    assert events[:len(first)] == first
    later = events[len(first):]
    assert later and all(e["at"] > 999 for e in later), later
    assert [e["at"] for e in later if e["rank"] == 1] == [1000.0]
    ats = [e["at"] for e in events if e["rank"] == 0]
    assert ats == sorted(set(ats))   # each moment once
    # on the continued clock: its start (the event's unix time less its moment) lies before the resume
    assert all(e["time"] - e["at"] < resumed_at for e in later)
    assert document["faults"]["clock_s"] > 1000


def test_a_stall_that_is_over_is_blamed_only_on_a_watchdogs_verdict_naming_its_rank():
    """A stall with ``for=`` whose process was continued, or one whose group was replaced, was
    survived: a later death (seen here: a worker SIGKILLed by hand 8 s after a 1-s stall ended
    was recorded as '[injected: stall of rank 1 ...]', the stall's action 'restart' and its time
    to detect 9 s) is not put down to it. A watchdog's verdict naming its rank still is: made
    while the stall lasted, it may be acted on a moment after the SIGCONT. Real processes (a
    ``sleep``) are stopped and continued; the record is a real run's."""
    import subprocess
    import time

    from mlbench.launch.injector import FaultRecord, Injector
    from mlbench.launch.processes import process_state
    from tests.helpers import last_run, wait_for

    mlbench("run", "task2a", "2", "--data", "synthetic", "--record-only", check=True)
    run_dir = last_run().run_dir
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    try:
        schedules = [parse_inject("stall:rank=0,at=0s,for=0.2s"), parse_inject("stall:rank=1,at=0s")]
        injector = Injector(schedules, time.time(), FaultRecord(run_dir), passed=None)
        _, held = injector.apply(procs)
        wait_for(lambda: all(process_state(p.pid) in ("T", "t") for p in procs), 10, "both to stop")
        time.sleep(0.3)
        assert injector.apply(procs) == []
        wait_for(lambda: process_state(procs[0].pid) not in ("T", "t"), 10, "rank 0 to be continued")
        assert process_state(procs[1].pid) in ("T", "t")   # no for=: stopped until a verdict
        events = FaultRecord(run_dir).events
        assert 0.2 <= events[0]["stopped_s"] < 60 and "stopped_s" not in events[1]   # 60: the sleep's life

        open_stall = FaultRecord(run_dir).culprit([0])   # rank 0's is over; rank 1's is not
        assert open_stall is not None and (open_stall["rank"], open_stall["at"]) == (held["rank"], held["at"])
        injector.forget_processes()   # the group is replaced: rank 1's stall is over too
        record = FaultRecord(run_dir)
        assert "stopped_s" in record.events[1]
        reason, faults = record.blame_all([0], "worker 0 was killed by SIGKILL", time.time())
        assert (reason, faults) == ("worker 0 was killed by SIGKILL", [])
        verdict = "worker 1 exited with code 1: watchdog: rank 0 made no progress for 9 s"
        reason, faults = record.blame_all([1], verdict, time.time())
        assert [(f["kind"], f["rank"]) for f in faults] == [("stall", 0)]
        assert reason.startswith(verdict + " [injected: stall of rank 0")
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()

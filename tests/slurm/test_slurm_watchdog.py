"""The watchdog on Slurm (issue 21, item 1; issue 24's `--inject stall`): no mlbench process owns
srun's workers, so they judge each other's heartbeats (on the run folder, which the nodes share);
a worker stopped by an injected stall makes the run end failed, naming its rank, within the
bound, far below gloo's timeout, and `status` says so with the stall's record."""

from __future__ import annotations

import json

from mlbench.launch.registry import launcher_of
from mlbench.results.store import RunStore
from mlbench.results.watchdog import blamed_ranks, collective_timeout_s, startup_bound_s
from tests.helpers import last_run, mlbench, run_json
from tests.slurm.test_slurm_runs import LONG_RUN, wait_for, worker_pid

#: Short enough for a test, long enough for a loaded 2-core box (as tests/test_faults.py's 5 s).
#: On that box the stall falls in the tasks' start (below), judged by the startup bound of ten
#: times this: at 8 s the test took 107 s there, its 80 s bound most of it.
BOUND_S = 5
#: After the bound of the stopped rank's phase: a heartbeat, srun ending the other task (KillWait
#: 5 s) and the job's end reaching squeue, with a wide margin; gloo alone would wait its
#: collective timeout (300 s here).
ENDS_AFTER_THE_BOUND_WITHIN_S = 40


def test_an_injected_stall_fails_the_slurm_run_naming_its_rank(slurm, libsvm_dir):
    """``stall:rank=1,at=6s`` (no ``for``: stopped until the job ends) is sent by the job's
    supervisor to task 1's process. It falls in training on an idle machine (the tasks train from
    about 3 s on), where the step bound of 5 s applies; on the loaded box it falls while task 1
    still starts (there, its rank 0 recorded its environment after 21 s of the job's fault clock:
    a stall at 20 s fell there too), where the startup bound (10 x 5 s) does: either way rank 1
    alone is blamed, the run fails under ``--on-failure fail`` soon after its phase's bound, and
    the stall's event records the action and the time to detect it."""
    assert collective_timeout_s(BOUND_S, 300.0) == 300.0
    mlbench("run", *LONG_RUN, "--data-dir", str(libsvm_dir), "--slurm", "--detach", "--watchdog", f"{BOUND_S}s",
            "--inject", "stall:rank=1,at=6s", "--on-failure", "fail", check=True)
    run = last_run()

    def stall() -> dict | None:
        return next(iter(run_json(run).get("faults", {}).get("events") or []), None)

    wait_for(stall, timeout=180, what="the stall to strike task 1")
    struck = stall()
    assert (struck["kind"], struck["rank"], struck["at"]) == ("stall", 1, 6.0) and "missed" not in struck, struck
    wait_for(lambda: not launcher_of(RunStore(), run).reconcile(run).active,
             timeout=startup_bound_s(BOUND_S) + ENDS_AFTER_THE_BOUND_WITHIN_S, what="the watchdog to fail the run")
    run = last_run()
    assert run.state == "failed"
    assert run.reason.startswith("worker 0 exited with code 1: watchdog: rank 1 made no progress for "), run.reason
    # rank 1 alone is blamed, by the bound of the phase it was stopped in, as stopped: its last
    # heartbeat may have come a moment after its last step, and the watchdog waits until that
    # beat is older than the bound rather than call it busy (mlbench.results.watchdog)
    assert blamed_ranks(run.reason) == (1,) and ": its process stopped answering (last step " in run.reason, \
        run.reason
    in_training = f"watchdog bound max({BOUND_S} s, 10 x median step " in run.reason
    assert in_training or f"startup bound {10 * BOUND_S} s" in run.reason, run.reason
    (event,) = run_json(run)["faults"]["events"]
    assert event["action"] == "fail" and event["detected_s"] >= BOUND_S - 1, event   # a beat up to 1 s old
    if in_training:
        assert event["detected_s"] < BOUND_S + ENDS_AFTER_THE_BOUND_WITHIN_S, event
    assert f"failed ({run.reason})" in mlbench("status", run.id, check=True).stdout
    shown = json.loads(mlbench("status", run.id, "-o", "json", check=True).stdout)["faults"]
    assert shown["on_failure"] == "fail" and [e["kind"] for e in shown["events"]] == ["stall"]
    wait_for(lambda: worker_pid(run.run_dir, 0) is None and worker_pid(run.run_dir, 1) is None,
             timeout=30, what="srun to end both workers")

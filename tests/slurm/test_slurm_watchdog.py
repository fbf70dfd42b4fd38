"""The watchdog on Slurm (issue 21, item 1): no mlbench process owns srun's workers, so they judge
each other's heartbeats (on the run folder, which the nodes share); a stopped worker makes the
run end failed, naming its rank, within the bound, far below gloo's timeout, and `status` says so."""

from __future__ import annotations

import time

from mlbench.launch.registry import launcher_of
from mlbench.results.heartbeat import read_beat
from mlbench.results.store import RunStore
from mlbench.results.watchdog import blamed_ranks, collective_timeout_s
from tests.helpers import last_run, mlbench, stop_while_training
from tests.slurm.test_slurm_runs import LONG_RUN, wait_for, worker_pid

#: Short enough for a test, long enough for a loaded 2-core box (as in tests/test_watchdog.py).
BOUND_S = 8
#: The bound, a heartbeat, srun ending the other task (KillWait 5 s) and the job's end reaching
#: squeue, with a wide margin; gloo alone would wait its collective timeout (300 s here).
ENDS_WITHIN_S = 120


def test_a_stopped_worker_fails_the_slurm_run_naming_its_rank(slurm, libsvm_dir):
    assert collective_timeout_s(BOUND_S, 300.0) == 300.0
    mlbench("run", *LONG_RUN, "--data-dir", str(libsvm_dir), "--slurm", "--detach", "--watchdog", f"{BOUND_S}s",
            check=True)
    run = last_run()
    wait_for(lambda: all((b := read_beat(run.run_dir, r)) is not None and b.step >= 20 for r in (0, 1))
             and worker_pid(run.run_dir, 1), what="both workers to train")
    stop_while_training(worker_pid(run.run_dir, 1), run.run_dir, 1)
    stopped = time.monotonic()
    wait_for(lambda: not launcher_of(RunStore(), run).reconcile(run).active, timeout=ENDS_WITHIN_S,
             what="the watchdog to fail the run")
    assert time.monotonic() - stopped < ENDS_WITHIN_S
    run = last_run()
    assert run.state == "failed"
    assert run.reason.startswith("worker 0 exited with code 1: watchdog: rank 1 made no progress for "), run.reason
    # rank 1 alone is blamed; the verdict's words depend on whether its last heartbeat was already
    # older than the bound ('its process stopped answering') or written a moment after its last
    # step, which a starved training thread leaves behind ('while ranks 0 waited for it')
    assert blamed_ranks(run.reason) == (1,) and "(last step " in run.reason, run.reason
    assert f"watchdog bound max({BOUND_S} s, 10 x median step " in run.reason
    assert f"failed ({run.reason})" in mlbench("status", run.id, check=True).stdout
    wait_for(lambda: worker_pid(run.run_dir, 0) is None and worker_pid(run.run_dir, 1) is None,
             timeout=30, what="srun to end both workers")

"""The watchdog of workers that post to `mlbench serve` without a shared run folder (issue 21):
torchrun's or srun's workers on machines that do not share the run folder cannot read each
other's heartbeats, and no supervisor owns them; the service that stores their heartbeats judges
them (mlbench/server/watch.py), fails the run naming the stalled rank, and tells the others in
its answer to their heartbeats, so that they exit and the user's launcher ends the rest.

Real worker processes (real torch.distributed, gloo), started with torchrun's environment as
torchrun starts them, each with its own copy of run.json, post to a real `python -m
mlbench.server` over the run store where `mlbench run --record-only` recorded the run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from mlbench.results.heartbeat import read_beat
from mlbench.results.http_sink import TOKEN_ENV, URL_ENV, run_token
from mlbench.results.store import RunStore
from tests import zygote
from tests.helpers import mlbench, stop_while_training, wait_for
from tests.server.conftest import WORKER_TOKEN, ServiceProcess, free_port

#: Short enough for a test, long enough for a loaded 2-core box (as in tests/test_watchdog.py).
BOUND = "8s"
#: The bound, a heartbeat, the watch's round, with a wide margin; gloo alone: 20 minutes.
ENDS_WITHIN_S = 90


def test_the_service_fails_a_run_whose_worker_stopped_naming_its_rank_and_the_others_exit(tmp_path):
    home = Path(os.environ["MLBENCH_HOME"])
    proc = mlbench("run", "task2a", "2", "--data", "synthetic", "--max-steps", "100000000", "--watchdog", BOUND,
                   "--record-only", check=True)
    run = RunStore().get(proc.stdout.split("Recorded run ")[1].split()[0])
    service = ServiceProcess(home, free_port(), tmp_path / "service.log").start()
    workers: list[subprocess.Popen] = []
    try:
        env = dict(os.environ, **{URL_ENV: service.url, TOKEN_ENV: run_token(WORKER_TOKEN, run.id)},
                   WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        for rank in (0, 1):
            machine = tmp_path / f"machine-{rank}"   # no shared run folder: a copy of run.json each
            machine.mkdir()
            shutil.copy(run.run_dir / "run.json", machine / "run.json")
            with open(tmp_path / f"rank-{rank}.log", "wb") as log:
                workers.append(zygote.popen_module([sys.executable, "-m", "mlbench.worker", str(machine)],
                                                   dict(env, RANK=str(rank), LOCAL_RANK=str(rank)), log))
        wait_for(lambda: all((b := read_beat(run.run_dir, r)) is not None and b.step >= 20 for r in (0, 1)),
                 150, "both workers to train (their heartbeats stored by the service)", interval=0.5)
        stop_while_training(workers[1].pid, run.run_dir, 1)
        stopped = time.monotonic()
        record = wait_for(lambda: r if not (r := RunStore().get(run.id)).active else None, ENDS_WITHIN_S,
                          "the service's watchdog to fail the run", interval=0.5)
        assert time.monotonic() - stopped < ENDS_WITHIN_S
        details = json.loads(mlbench("status", run.id, "-o", "json", check=True).stdout)
        assert details["state"] == "failed", details
        assert details["reason"] == record.reason
        assert record.reason.startswith("rank 1 made no progress for "), record.reason
        assert ": its process stopped answering (last step " in record.reason
        assert "watchdog bound max(8 s, 10 x median step " in record.reason
        # rank 0 learns the verdict from the answer to its heartbeat and exits, as on a shared folder
        assert workers[0].wait(timeout=60) == 1
        log = (tmp_path / "rank-0.log").read_text()
        assert f"Error: watchdog: {record.reason}" in log, log[-2000:]
        assert workers[1].poll() is None  # stopped: the user's launcher kills it (here, the test)
    finally:
        for worker in workers:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
        service.kill()

"""Runs whose workers the user starts with a launcher of their own (``mlbench run --record-only``).

mlbench records the run (its folder and run.json, on a file system every machine shares) and
prints the commands; torchrun, srun or mpirun start ``python -m mlbench.worker RUN_DIR`` on each
machine, and the workers find their rank and rank 0 in the launcher's environment
(:mod:`mlbench.worker.launcher_env`). No mlbench process watches them, so the run's state is
read from what they recorded (:mod:`mlbench.launch.run_folder`).
"""

from __future__ import annotations

import shlex
import sys

from mlbench.errors import UsageError
from mlbench.launch.base import EventCallback, Launcher
from mlbench.launch.plan import RunRequest, create_run
from mlbench.launch.run_folder import read_outcome
from mlbench.results.store import CANCELLED, FAILED, FINISHED, PENDING, RunRecord, RunStore

LAUNCHER = "external"


def worker_commands(run: RunRecord) -> list[tuple[str, str]]:
    """Ways to start the run's workers: (where, command)."""
    run_dir, python, k = shlex.quote(str(run.run_dir)), shlex.quote(sys.executable), run.workers
    worker = f"-m mlbench.worker {run_dir}"
    return [("on this machine", f"torchrun --standalone --nproc-per-node {k} {worker}"),
            (f"on NODES machines of PER_NODE workers each (NODES x PER_NODE = {k}), on every one",
             f"torchrun --nnodes NODES --nproc-per-node PER_NODE --rdzv-backend c10d "
             f"--rdzv-endpoint FIRST_HOST:29500 {worker}"),
            ("inside a Slurm allocation", f"srun -n {k} {python} {worker}"),
            ("with Open MPI", f"mpirun -np {k} -x MASTER_ADDR=FIRST_HOST -x MASTER_PORT=29500 "
                              f"{python} {worker}")]


def reconcile(store: RunStore, run: RunRecord) -> RunRecord:
    """The run's state from its folder: running once a worker recorded something, finished with
    rank 0's result, failed with the first worker error."""
    if not run.active:
        return run
    outcome = read_outcome(run.run_dir)
    if outcome.result is not None:
        store.mark_ended(run.id, FINISHED, result=outcome.result)
    elif outcome.error is not None:
        store.mark_ended(run.id, FAILED, reason=outcome.error)
    elif outcome.started_at is not None and run.state == PENDING:
        store.mark_started(run.id, started_at=outcome.started_at)
    return store.get(run.id)


def cancel(store: RunStore, run: RunRecord) -> RunRecord:
    """Mark the run cancelled; its processes belong to the user's launcher, which stops them."""
    store.mark_ended(run.id, CANCELLED, reason="cancelled by the user (its workers were started "
                                               "outside mlbench: stop them with their launcher)")
    return store.get(run.id)


class ExternalLauncher(Launcher):
    """Runs whose workers the user starts with a launcher of their own (torchrun, srun, mpirun):
    mlbench records the run (``--record-only``) and reads its state from the run folder."""

    name = LAUNCHER

    def create(self, request: RunRequest) -> RunRecord:
        return create_run(self.store, request, launcher=LAUNCHER)

    def run_attached(self, record: RunRecord, on_event: EventCallback | None = None) -> RunRecord:
        raise UsageError("a --record-only run is started by your own launcher; see its commands "
                         f"with: mlbench status {record.id}")

    def start_detached(self, record: RunRecord) -> None:
        self.run_attached(record)

    def cancel(self, record: RunRecord) -> RunRecord:
        return cancel(self.store, record)

    def reconcile(self, record: RunRecord) -> RunRecord:
        return reconcile(self.store, record)

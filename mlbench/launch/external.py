"""Runs whose workers the user starts with a launcher of their own (``mlbench run --record-only``).

mlbench records the run (its folder and run.json, on a file system every machine shares) and
prints the commands; torchrun, srun or mpirun start ``python -m mlbench.worker RUN_DIR`` on each
machine, and the workers find their rank and rank 0 in the launcher's environment
(:mod:`mlbench.worker.launcher_env`). No mlbench process watches them, so the run's state is
read from what they recorded (:mod:`mlbench.launch.run_folder`), and the machines it occupied
from the hosts its workers reported (this machine alone: a run that costs nothing unless priced,
as a local one).
"""

from __future__ import annotations

import shlex
import socket
import sys
from collections.abc import Iterator

from mlbench.errors import MlbenchError, UsageError
from mlbench.launch.base import EventCallback, Launcher, LauncherOption
from mlbench.launch.follow import check_rank
from mlbench.launch.plan import RunRequest, WorkerResources
from mlbench.launch.run_folder import log_path, read_outcome, worker_hosts
from mlbench.results.store import CANCELLED, FAILED, FINISHED, PENDING, RunRecord
from mlbench.run_config import RunDocument

CANCELLED_OUTSIDE = ("cancelled by the user (its workers were started outside mlbench: stop them "
                     "with their launcher)")


class ExternalLauncher(Launcher):
    """Runs whose workers the user starts with a launcher of their own (torchrun, srun, mpirun):
    mlbench records the run (``--record-only``) and reads its state from the run folder."""

    name = "external"
    label = "--record-only"
    choose_option = LauncherOption(
        "--record-only", "record_only", is_flag=True,
        help="Only record the run; start its workers yourself with torchrun, srun or mpirun "
             "(the commands are printed).")
    how_to_choose = "add --record-only"
    records_only = True

    def occupied_nodes(self, request: RunRequest, resources: WorkerResources | None) -> int:
        """One (torchrun on this machine, the first command printed) until the workers report
        their hosts (:meth:`reconcile`)."""
        return 1

    def create(self, request: RunRequest) -> RunRecord:
        return self.record(request)

    def worker_commands(self, record: RunRecord) -> list[tuple[str, str]]:
        """torchrun on this machine or on several, srun in an allocation, Open MPI's mpirun."""
        run_dir, python, k = shlex.quote(str(record.run_dir)), shlex.quote(sys.executable), record.workers
        worker = f"-m mlbench.worker {run_dir}"
        return [("on this machine", f"torchrun --standalone --nproc-per-node {k} {worker}"),
                (f"on NODES machines of PER_NODE workers each (NODES x PER_NODE = {k}), on every one",
                 f"torchrun --nnodes NODES --nproc-per-node PER_NODE --rdzv-backend c10d "
                 f"--rdzv-endpoint FIRST_HOST:29500 {worker}"),
                ("inside a Slurm allocation", f"srun -n {k} {python} {worker}"),
                ("with Open MPI", f"mpirun -np {k} -x MASTER_ADDR=FIRST_HOST -x MASTER_PORT=29500 "
                                  f"{python} {worker}")]

    def run_attached(self, record: RunRecord, on_event: EventCallback | None = None) -> RunRecord:
        raise UsageError("a --record-only run is started by your own launcher; see its commands "
                         f"with: mlbench status {record.id}")

    def start_detached(self, record: RunRecord) -> None:
        self.run_attached(record)

    def logs(self, record: RunRecord, rank: int, follow: bool = False) -> Iterator[str]:
        """The workers' output goes where the user's launcher puts it, not into the run folder
        (unless the user sent it to ``RUN_DIR/logs/rank-R.log``): one line says so."""
        check_rank(record, rank)
        if not log_path(record.run_dir, rank).exists():
            raise MlbenchError(f"run {record.id} is a --record-only run: its workers' output is where their launcher "
                               f"put it (torchrun's terminal, srun's --output); its metrics and result: "
                               f"mlbench status {record.id}")
        return super().logs(record, rank, follow)

    def cancel(self, record: RunRecord) -> RunRecord:
        """Mark the run cancelled; its processes belong to the user's launcher, which stops them."""
        self.store.mark_ended(record.id, CANCELLED, reason=CANCELLED_OUTSIDE)
        return self.store.get(record.id)

    def reconcile(self, record: RunRecord) -> RunRecord:
        """The run's state from its folder: running once a worker recorded something, finished
        with rank 0's result, failed with the first worker error; once it has ended, run.json
        records the machines its workers reported."""
        if not record.active:
            return record
        outcome = read_outcome(record.run_dir)
        if record.started_at is None and outcome.started_at is not None and \
                (outcome.result is not None or outcome.error is not None):
            # it ended before anything looked: its start is still its workers' first record
            self.store.update(record.id, started_at=outcome.started_at)
        if outcome.result is not None:
            self._record_hosts(record)
            self.store.mark_ended(record.id, FINISHED, result=outcome.result)
        elif outcome.error is not None:
            self._record_hosts(record)
            self.store.mark_ended(record.id, FAILED, reason=outcome.error)
        elif outcome.started_at is not None and record.state == PENDING:
            self.store.mark_started(record.id, started_at=outcome.started_at)
        return self.store.get(record.id)

    @staticmethod
    def _record_hosts(record: RunRecord) -> None:
        """run.json: as many nodes as hosts the workers reported, this machine when it was the
        only one."""
        hosts = worker_hosts(record.run_dir)
        document = RunDocument.load_or_none(record.run_dir)
        if not hosts or document is None:
            return
        here = hosts == {socket.gethostname()}
        if (document.nodes, document.on_this_machine) != (len(hosts), here):
            document.nodes, document.on_this_machine = len(hosts), here
            document.save(record.run_dir)

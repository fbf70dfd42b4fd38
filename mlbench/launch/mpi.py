"""``--backend mpi``: the workers are the ranks of one ``mpirun``.

PyTorch's MPI backend takes its rank and world size from MPI itself (PyTorch's documentation,
"Distributed communication package", MPI backend: available only when PyTorch was built with
MPI), so its ranks cannot be started one by one as mlbench starts gloo's: one ``mpirun`` starts
them all, each running ``python -m mlbench.worker RUN_DIR`` without ``--rank`` (the worker reads
its rank from Open MPI's environment, see :mod:`mlbench.worker.launcher_env`). The options are
Open MPI's, the MPI that PyTorch's MPI builds use: no binding of ranks to cores (mlbench sets
the threads per worker itself) and more ranks than cores allowed, as for local gloo runs.

MPI is a backend of the launchers, not a launcher of its own: on this machine the local launcher
starts :class:`MpiProcesses` in place of one process per worker and supervises it as any local
run (so its runs, old and new, are cancelled and reconciled as local runs); in a Slurm job the
batch script runs the same command inside the allocation (launch/slurm_script.py).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from mlbench.errors import UsageError
from mlbench.launch.run_folder import log_tail, logs_dir, rank_error
from mlbench.launch.supervisor import WorkerProcesses, describe_exit, mark_supervised, record_pids
from mlbench.run_config import RunDocument

MPIRUN_LOG = "mpirun.log"


def uses_mpirun(run_dir: Path) -> bool:
    """Whether the run's backend is MPI (an unreadable run.json is the local launcher's to report)."""
    document = RunDocument.load_or_none(run_dir)
    return document is not None and document.config.backend == "mpi"


def mpirun_command(workers: int, run_dir: str | os.PathLike, python: str = sys.executable,
                   mpirun: str = "mpirun", oversubscribe: bool = True,
                   worker_args: tuple[str, ...] = ()) -> list[str]:
    """The command that starts the run's ``workers`` ranks (Open MPI's options)."""
    if workers < 1:
        raise UsageError(f"the number of workers must be at least 1, not {workers}")
    cmd = [mpirun, "-np", str(workers), "--bind-to", "none", "--tag-output"]
    if oversubscribe:
        cmd.append("--oversubscribe")
    return cmd + [python, "-m", "mlbench.worker", str(run_dir), *worker_args]


def find_mpirun() -> str:
    path = shutil.which("mpirun")
    if path is None:
        raise UsageError("--backend mpi: mpirun is not on PATH; install the MPI that PyTorch was "
                         "built with (Open MPI), or use --backend gloo")
    return path


class MpiProcesses(WorkerProcesses):
    """One ``mpirun`` process in place of one process per worker; the same supervision."""

    def start(self, restarting: bool = False) -> None:
        """Start mpirun (``restarting`` is never asked: --inject and --on-failure refuse --backend mpi)."""
        config = RunDocument.load(self.run_dir).config
        env = self.worker_env(config)
        cmd = mpirun_command(config.workers, self.run_dir, mpirun=find_mpirun())
        self.procs.append(self.spawn(cmd, MPIRUN_LOG, env))
        record_pids(self.run_dir, [p.pid for p in self.procs])
        mark_supervised(self.store, self.run)

    def failure_reason(self, index: int, code: int) -> str:
        """mpirun ended badly: the first worker that recorded an error says why."""
        reason = f"mpirun {describe_exit(code)}"
        workers = RunDocument.load(self.run_dir).config.workers
        for rank in range(workers):
            error = rank_error(self.run_dir, rank)
            if error:
                return f"{reason}: worker {rank}: {error}"
        tail = log_tail(logs_dir(self.run_dir) / MPIRUN_LOG)
        return f"{reason}: {tail}" if tail else reason


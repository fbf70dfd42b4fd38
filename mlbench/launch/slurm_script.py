"""The batch script of a run on Slurm: what `mlbench run --slurm` submits, kept in the run folder.

One job of WORKERS tasks (``--ntasks``); the batch script runs on the first node of the
allocation (Slurm's ``sbatch`` manual, DESCRIPTION), which is also where ``srun`` puts task 0,
rank 0: so the script names that node ``MASTER_ADDR`` (``scontrol show hostnames``) and picks a
free port there for the rendezvous (``MASTER_PORT``); ``srun`` then starts one worker per task,
each learning its rank from ``SLURM_PROCID`` (:mod:`mlbench.worker.launcher_env`).
``--kill-on-bad-exit`` ends every task when one fails, as the local launcher does. Every task
writes its events and log into the run folder, which must therefore be on a file system that the
nodes share with the machine that submitted the job.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlbench.version import __version__
from mlbench.errors import UsageError
from mlbench.frameworks import PYTORCH
from mlbench.launch.mpi import MPIRUN_LOG, mpirun_command

SCRIPT_NAME = "job.sbatch"
_FREE_PORT = 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'
# Slurm's time formats (sbatch --time): M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or unlimited
_TIME = re.compile(r"^(\d+-\d+(:\d+(:\d+)?)?|\d+(:\d+(:\d+)?)?|UNLIMITED|INFINITE)$", re.IGNORECASE)
# options that mlbench itself must set for the run to be what run.json says
_RESERVED = ("-n", "--ntasks", "-o", "--output", "-e", "--error", "-D", "--chdir", "-a", "--array",
             "--wrap", "-J", "--job-name", "--ntasks-per-node", "-c", "--cpus-per-task",
             "--gpus-per-task", "-p", "--partition", "-A", "--account", "-t", "--time",
             "-C", "--constraint")


@dataclass
class SlurmOptions:
    """What `mlbench run --slurm` accepts for the job (recorded in run.json's placement)."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None
    gpus_per_task: int | None = None
    cpus_per_task: int = 1
    constraint: str | None = None
    extra: list[str] = field(default_factory=list)  # further #SBATCH lines, e.g. "--nodes=2"
    iface: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def validate(self) -> SlurmOptions:
        """One line for every value that sbatch would refuse or that would change the run."""
        for name in ("partition", "account", "time", "constraint", "iface"):
            value = getattr(self, name)
            if value is not None and (not value.strip() or any(c.isspace() for c in value)):
                raise UsageError(f"--{name.replace('_', '-')} {value!r}: give one word without spaces")
        if self.time is not None and not _TIME.match(self.time):
            raise UsageError(f"--time {self.time}: use Slurm's format, e.g. 30, 01:00:00 or 1-12:00:00")
        if self.cpus_per_task < 1:
            raise UsageError(f"--cpus-per-task must be at least 1, not {self.cpus_per_task}")
        if self.gpus_per_task is not None and self.gpus_per_task < 0:
            raise UsageError(f"--gpus-per-task must be 0 or more, not {self.gpus_per_task}")
        self.extra = [_sbatch_line(line) for line in self.extra]
        return self


def _sbatch_line(line: str) -> str:
    text = line.strip()
    if text.startswith("#SBATCH"):
        text = text[len("#SBATCH"):].strip()
    option = text.split("=", 1)[0].split(None, 1)[0] if text else ""
    if not option.startswith("-") or "\n" in line or "\r" in line:
        raise UsageError(f"--sbatch-option {line!r}: give one sbatch option, e.g. --sbatch-option "
                         "--nodes=2 or --sbatch-option '--mem=8G'")
    if option in _RESERVED:
        raise UsageError(f"--sbatch-option {line!r}: mlbench sets {option} itself (use its own "
                         "option of `mlbench run` where there is one)")
    return text


def render_script(run_id: str, name: str, run_dir: Path, workers: int, backend: str,
                  options: SlurmOptions, python: str, worker: str = PYTORCH.worker,
                  supervised: bool = False) -> str:
    """The batch script's text (its #SBATCH lines are the job's resources); ``worker``: the
    module each task runs (a framework's port, :attr:`mlbench.frameworks.Framework.worker`),
    which learns its rank and rank 0's address from srun's and this script's environment.
    ``supervised`` (a run that checkpoints, injects faults or restarts): the job may be started
    again by Slurm (``--requeue``, its output appended to), and the steps are run by the
    supervisor inside the job (:mod:`mlbench.launch.slurm_supervisor`), which resumes a requeued
    job from its newest checkpoint, injects the faults and restarts a failed step."""
    if any(c.isspace() for c in str(run_dir)):
        raise UsageError(f"--slurm: the run folder {run_dir} has a space in its path, which "
                         "#SBATCH lines cannot carry; set MLBENCH_HOME to a folder without spaces "
                         "on a file system the nodes share")
    directives = [f"--job-name=mlbench-{run_id}", f"--ntasks={workers}",
                  f"--cpus-per-task={options.cpus_per_task}", f"--chdir={run_dir}",
                  f"--output={run_dir}/logs/slurm-%j.out"]
    for flag, value in (("partition", options.partition), ("account", options.account),
                        ("time", options.time), ("constraint", options.constraint)):
        if value:
            directives.append(f"--{flag}={value}")
    if options.gpus_per_task:
        directives.append(f"--gpus-per-task={options.gpus_per_task}")
    supervised = supervised and backend != "mpi"
    if supervised:
        directives += ["--requeue", "--open-mode=append"]
    directives += options.extra
    worker_args = ("--iface", options.iface) if options.iface else ()
    if backend == "mpi":  # MPI's own rendezvous; Open MPI's mpirun reads the allocation
        launch = shlex.join(mpirun_command(workers, run_dir, python=python, oversubscribe=False,
                                           worker_args=worker_args))
        launch += f" > {shlex.quote(str(run_dir / 'logs' / MPIRUN_LOG))} 2>&1"
    else:
        srun = ["srun", "--kill-on-bad-exit=1", f"--output={run_dir}/logs/rank-%t.log",
                *(["--open-mode=append"] if supervised else []), python, "-m", worker, str(run_dir), *worker_args]
        launch = shlex.join(["exec", python, "-m", "mlbench.launch.slurm_supervisor", str(run_dir), "--", *srun]
                            if supervised else srun)
    threads = options.cpus_per_task
    lines = [
        "#!/bin/bash",
        f"# mlbench run {run_id} ({name}): {workers} worker(s), written by mlbench {__version__}.",
        "# The run folder must be on a file system that every node shares.",
        *(f"#SBATCH {d}" for d in directives),
        "set -eu",
        "umask 077  # the workers' logs and events (srun --output, mpirun's log) are the user's alone",
        "# rank 0 is task 0, on the first node of the allocation, where this script runs",
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        f'MASTER_PORT="$({shlex.quote(python)} -c {shlex.quote(_FREE_PORT)})"',
        f"export MASTER_ADDR MASTER_PORT OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} "
        "PYTHONUNBUFFERED=1",
        launch,
        "",
    ]
    return "\n".join(lines)

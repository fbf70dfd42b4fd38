"""`mlbench run` options for workers started by Slurm or by the user's own launcher.

Declared once as a decorator so that `run` receives two values, ``slurm`` (the job's
:class:`~mlbench.launch.slurm_script.SlurmOptions`, or None for a run on this machine or a
Kubernetes cluster) and ``record_only``.
"""

from __future__ import annotations

import functools
from typing import Any
from collections.abc import Callable

import click

from mlbench.errors import UsageError
from mlbench.launch.external import worker_commands
from mlbench.launch.slurm_script import SlurmOptions
from mlbench.results.store import RunRecord

_SLURM_ONLY = ("partition", "account", "time", "gpus_per_task", "cpus_per_task", "constraint",
               "sbatch_options", "iface")


def launcher_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add --slurm and its options, and --record-only, to a click command."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = {name: kwargs.pop(name) for name in _SLURM_ONLY}
        use_slurm, record_only = kwargs.pop("use_slurm"), kwargs.pop("record_only")
        given = [f"--{name.replace('_', '-').replace('sbatch-options', 'sbatch-option')}"
                 for name, value in values.items() if value not in (None, ())]
        if given and not use_slurm:
            raise UsageError(f"{given[0]} is an option of Slurm runs; add --slurm")
        if use_slurm and record_only:
            raise UsageError("--record-only records a run for a launcher of your own; --slurm "
                             "submits it to Slurm: choose one")
        kwargs["slurm"] = SlurmOptions(
            partition=values["partition"], account=values["account"], time=values["time"],
            gpus_per_task=values["gpus_per_task"], cpus_per_task=values["cpus_per_task"] or 1,
            constraint=values["constraint"], extra=list(values["sbatch_options"]),
            iface=values["iface"]).validate() if use_slurm else None
        kwargs["record_only"] = record_only
        return command(*args, **kwargs)

    options = [
        click.option("--slurm", "use_slurm", is_flag=True,
                     help="Submit the run as a Slurm job (sbatch) and follow it; the run store "
                          "(MLBENCH_HOME) must be on a file system the nodes share."),
        click.option("--partition", help="Slurm partition of the job."),
        click.option("--account", help="Slurm account charged for the job."),
        click.option("--time", help="Slurm time limit of the job, e.g. 01:00:00."),
        click.option("--gpus-per-task", type=int, help="GPUs per worker (Slurm job)."),
        click.option("--cpus-per-task", type=int,
                     help="CPU cores, and threads, per worker (Slurm job) [1]."),
        click.option("--constraint", help="Slurm node features the job needs, e.g. ib."),
        click.option("--sbatch-option", "sbatch_options", multiple=True, metavar="OPTION",
                     help="A further #SBATCH line, e.g. --sbatch-option=--nodes=2 (repeatable)."),
        click.option("--iface", help="Network interface of the workers' traffic between nodes "
                                     "(Slurm job) [the one that reaches rank 0]."),
        click.option("--record-only", is_flag=True,
                     help="Only record the run; start its workers yourself with torchrun, srun "
                          "or mpirun (the commands are printed)."),
    ]
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


def print_worker_commands(record: RunRecord) -> None:
    click.echo(f"Recorded run {record.id} ({record.name}) in {record.run_dir}.")
    click.echo(f"Start its {record.workers} worker(s) with a launcher of your own:")
    for where, command in worker_commands(record):
        click.echo(f"  # {where}\n  {command}")
    click.echo(f"Follow it with: mlbench status {record.id}")

"""`mlbench logs RUN` and `mlbench status RUN --follow`: a run's output and progress, live.

Both work on any run of the current store, whoever started it (this terminal, a ``--detach``,
another machine for a cluster run); the launcher of the run (:meth:`Launcher.follow
<mlbench.launch.base.Launcher.follow>` and :meth:`Launcher.logs <mlbench.launch.base.Launcher.logs>`)
does the following.
"""

from __future__ import annotations

import click

from mlbench.cli import cli
from mlbench.cli.allreduce import AllreducePrinter
from mlbench.cli.completion import complete_runs
from mlbench.cli.format import ProgressPrinter
from mlbench.launch import session
from mlbench.launch.base import Launcher
from mlbench.launch.registry import launcher_of
from mlbench.results.events import read_run_events
from mlbench.results.store import RunRecord
from mlbench.results.summary import summarize
from mlbench.tasks.registry import TASKS
from mlbench.tasks.spec import AllreduceSpec


def follow_progress(launcher: Launcher, record: RunRecord) -> RunRecord:
    """Print the run's progress lines (as `mlbench run` does in the foreground) from its first
    event until it ends, then its result; returns the final record."""
    allreduce = isinstance(TASKS.get(record.task), AllreduceSpec)
    printer = AllreducePrinter(record) if allreduce else ProgressPrinter(record)
    printer.header()
    final = launcher.follow(record, printer)
    printer.footer(final, summarize(read_run_events(final.run_dir)))
    return final


@cli.command()
@click.argument("run_ref", metavar="RUN", shell_complete=complete_runs)
@click.option("--rank", "-r", type=int, default=0, show_default=True, help="Which worker's output.")
@click.option("--follow", "-f", is_flag=True, help="Print new lines as they are written, until the run ends.")
def logs(run_ref, rank, follow) -> None:
    """The output of one worker of RUN (a local run's RUN_DIR/logs/rank-R.log; a cluster run's
    pod log, kept in the run store once the pod has ended)."""
    store = session.open_store(read_only=True)
    launcher = launcher_of(store, store.get(run_ref))
    record = launcher.reconcile(store.get(run_ref))
    for line in launcher.logs(record, rank, follow):
        click.echo(line)

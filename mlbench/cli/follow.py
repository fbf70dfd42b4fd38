"""`mlbench logs RUN`, `mlbench status RUN --follow` and `mlbench wait RUN...`: a run's output
and progress, live, and its verdict when it ends.

All three work on any run of the current store, whoever started it (this terminal, a ``--detach``,
another machine for a cluster run); the launcher of the run (:meth:`Launcher.follow
<mlbench.launch.base.Launcher.follow>` and :meth:`Launcher.logs <mlbench.launch.base.Launcher.logs>`)
does the following.
"""

from __future__ import annotations

import sys

import click

from mlbench import api
from mlbench.cli import cli
from mlbench.cli.allreduce import AllreducePrinter
from mlbench.cli.completion import complete_runs
from mlbench.cli.format import ProgressPrinter
from mlbench.cli.output import emit, output_option
from mlbench.launch import session
from mlbench.launch.plan import parse_duration
from mlbench.launch.registry import launcher_of
from mlbench.launch.run_folder import ranks_with_output
from mlbench.results.events import read_run_events
from mlbench.results.report import describe_result
from mlbench.results.store import RunRecord
from mlbench.results.summary import summarize
from mlbench.tasks.registry import TASKS
from mlbench.tasks.spec import AllreduceSpec


def follow_progress(run: api.RunInfo) -> api.Run:
    """Print the run's progress lines (as `mlbench run` does in the foreground) from its first
    event until it ends, then its result; returns the run as it ended."""
    allreduce = isinstance(TASKS.get(run.task), AllreduceSpec)
    printer = AllreducePrinter(run.record) if allreduce else ProgressPrinter(run.record)
    printer.header()
    final = api.follow(run.id, on_event=printer)
    printer.footer(final.record, summarize(read_run_events(final.run_dir)))
    return final


@cli.command()
@click.argument("run_ref", metavar="RUN", shell_complete=complete_runs)
@click.option("--rank", "-r", type=int, default=0, show_default=True, help="Which worker's output.")
@click.option("--follow", "-f", is_flag=True, help="Print new lines as they are written, until the run ends.")
def logs(run_ref, rank, follow) -> None:
    """The output of one worker of RUN (a local run's RUN_DIR/logs/rank-R.log; a cluster run's
    pod log, kept in the run store once the pod has ended). The metrics are not in it: they are
    events (`mlbench status RUN`). A worker without output gets one line on standard error that
    says so."""
    store = session.open_store(read_only=True)
    launcher = launcher_of(store, store.get(run_ref))
    record = launcher.reconcile(store.get(run_ref))
    printed = False
    for line in launcher.logs(record, rank, follow):
        click.echo(line)
        printed = True
    if not printed:
        click.echo(no_output(store.get(record.id), rank), err=True)


def no_output(record: RunRecord, rank: int) -> str:
    """What `mlbench logs` says of a worker whose log is empty: where another worker's output
    is, else that the run's workers wrote none and where its metrics are."""
    others = [r for r in ranks_with_output(record.run_dir, record.workers) if r != rank]
    if others:
        return (f"Worker {rank} of run {record.id} wrote no output; worker {others[0]} did: "
                f"mlbench logs {record.id} --rank {others[0]}")
    workers = "its worker" if record.workers == 1 else f"its {record.workers} workers"
    return (f"Run {record.id}: {workers} wrote no output{' so far' if record.active else ''}; its metrics and "
            f"result: mlbench status {record.id}")


def verdict(record: RunRecord) -> str:
    """One line on how a run ended (or that it still goes on), for `mlbench wait`."""
    who = f"Run {record.id} ({record.name})"
    if record.active:
        return f"{who} is still {record.state}."
    if record.state == "finished":
        return f"{who} finished: {describe_result(record.result) or 'no result recorded.'}"
    if record.state == "cancelled":
        return f"{who} was cancelled."
    return f"{who} {record.state}: {record.reason}"


@cli.command()
@click.argument("run_refs", metavar="RUN...", nargs=-1, required=True, shell_complete=complete_runs)
@click.option("--timeout", metavar="DURATION",
              help="Give up waiting after DURATION (90s, 10m, 1h30m) and exit 124; the runs go on.")
@output_option(help="table: a line per run as it ends; json or yaml: at the end, `exit_code` and "
                    "`runs` (`status -o json` entries).")
def wait(run_refs, timeout, output) -> None:
    """Wait until every RUN has ended and exit with the code `mlbench run` would have exited
    with: 0 (goal reached, or no goal), 3 (finished below its goal), 1 (failed), 130 (cancelled);
    with several runs the worst (130, then 1, then 3). 124: --timeout passed first.

    \b
    Examples:
      mlbench wait 3f2a9c1d
      RUN=$(mlbench run task2a 2 --detach -o json | jq -r .id); mlbench wait $RUN --timeout 1h
    """
    limit = parse_duration(timeout) if timeout else None
    table = output == "table"
    code, runs = api.wait(list(run_refs), timeout=limit,
                          on_end=(lambda r: click.echo(verdict(r.record))) if table else None)
    going = [r for r in runs if r.active]
    if table:
        for run in going:
            click.echo(verdict(run.record))
    else:
        emit({"exit_code": code, "runs": [r.entry() for r in runs]}, output)
    if going:
        click.echo(f"Stopped waiting after --timeout {timeout}: {len(going)} run(s) still going on "
                   "(`mlbench cancel RUN` stops one).", err=True)
    sys.exit(code)

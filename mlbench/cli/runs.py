"""`mlbench tasks | run | resume | status | download | cancel | delete`: running benchmarks and their results."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import click

from mlbench import api
from mlbench.cli import cli
from mlbench.cli.allreduce import AllreducePrinter, print_allreduce_table, task_rows
from mlbench.cli.completion import complete_runs, complete_tasks
from mlbench.cli.follow import follow_progress
from mlbench.cli.format import ProgressPrinter, print_run_details, status_table
from mlbench.cli.launchers import launcher_options, print_worker_commands
from mlbench.cli.optimizers import print_compression
from mlbench.cli.output import emit, output_option, tabulate
from mlbench.cli.run_options import run_options
from mlbench.errors import UsageError
from mlbench.launch import session
from mlbench.launch.base import NO_STEP_CAP
from mlbench.launch.plan import RunRequest
from mlbench.launch.registry import choose, launcher_of
from mlbench.results.events import read_run_events
from mlbench.results.live_export import parse_targets
from mlbench.results.report import run_overview
from mlbench.results.store import RunRecord
from mlbench.run_config import RunDocument
from mlbench.results.summary import summarize
from mlbench.tasks.models import MODEL_NAMES
from mlbench.tasks.records import spec_to_dict
from mlbench.tasks.registry import TASKS, get_task
from mlbench.tasks.spec import AllreduceSpec, describe_task


@cli.command()
@output_option
def tasks(output) -> None:
    """The benchmark tasks with their closed-division specification and goals."""
    from mlbench.tasks.models.plugins import ENTRY_POINT_GROUP, describe_installed_models

    plugins = describe_installed_models()
    if output != "table":
        emit({"tasks": [spec_to_dict(spec) for spec in TASKS.values()], "models": list(MODEL_NAMES),
              "model_plugins": plugins}, output)
        return
    for spec in TASKS.values():
        if isinstance(spec, AllreduceSpec):
            table = tabulate(task_rows(dataclasses.asdict(spec)), tablefmt='plain')
            click.echo(f"{spec.name}: {spec.title}\n{table}\n")
            continue
        rows = describe_task(spec)
        if spec.notes:
            rows.append(["note", spec.notes])
        click.echo(f"{spec.name}: {spec.title}")
        click.echo(tabulate(rows, tablefmt="plain"))
        click.echo("")
    click.echo("Models for --model: " + ", ".join(MODEL_NAMES))
    if plugins:
        click.echo(f"Installed model plug-ins (entry points of {ENTRY_POINT_GROUP}; --model NAME, open division):")
        for plugin in plugins:
            source = f"{plugin['value']}" + (f" of {plugin['distribution']}" if plugin["distribution"] else "")
            state = (f"cannot be used: {plugin['error']}" if "error" in plugin
                     else f"sha256 {plugin['sha256'][:12]}")
            click.echo(f"  {plugin['name']} = {source}, {state}")


@cli.command(context_settings={"show_default": True})
@click.argument("task", shell_complete=complete_tasks)
@click.argument("workers", nargs=-1, required=True, type=int)
@run_options
@output_option(help="With --detach: json or yaml prints the started run's record (as a `status -o json` "
                    "entry, id first) instead of a sentence.")
@launcher_options
def run(task, workers, output, launch, **options) -> None:
    """Run TASK on WORKERS processes on this machine, or as pods on the current cluster
    (`mlbench set-cluster`); one run per worker count given.

    \b
    Examples:
      mlbench run task0a 4
      mlbench run task1a 2 --light
      mlbench run task2a 4 --data-dir ~/data/epsilon
      mlbench run task2a 2 --framework jax
      mlbench run task2a 2 --framework tensorflow
      mlbench run task1a 1 2 4 --time-budget 10m
      mlbench run task1a 1 2 4 8 --repeat 3
      mlbench run task1a 8 --slurm --partition gpu --gpus-per-task 1 --time 01:00:00
      mlbench run task1a 8 --record-only     # then: torchrun ... -m mlbench.worker RUN_DIR
      mlbench run task1a 2 --light --bandwidth 100mbit,1gbit,10gbit --latency 0.5ms
      RUN=$(mlbench run task2a 2 --detach -o json | jq -r .id); mlbench wait $RUN
      mlbench run task2a 2 --data synthetic --log-to tensorboard:tb/
    """
    log_to, detach = options.pop("log_to"), options["detach"]
    if log_to and detach:
        raise UsageError("--log-to writes a run as this command follows it; a detached run is followed by "
                         "nobody: leave out --detach, or `mlbench export RUN --to TOOL DIR` when it has ended")
    targets = parse_targets(log_to)
    if output != "table" and not detach:
        raise UsageError(f"-o {output} prints the record of a run started with --detach: add --detach "
                         "(then `mlbench wait RUN -o json` gives its result)")
    plan = api.plan(task, workers, **options)
    # with -o json the launcher's progress (an image built, a cluster reached) goes to stderr,
    # so that stdout is the document alone
    launcher = choose(session.open_store(), launch,
                      progress=click.echo if output == "table" else lambda line: click.echo(line, err=True))
    launcher.settings.log_to = targets
    if launcher.records_only:
        if log_to:
            raise UsageError("--log-to writes a run as this command follows it; --record-only starts none")
        if output != "table":
            raise UsageError(f"-o {output} prints a started run's record; --record-only starts none")
        for request in plan.requests:
            print_worker_commands(launcher, launcher.create(request))
        return
    if detach:
        record = session.start_detached(launcher, plan)
        if output != "table":
            emit(run_overview(record), output)
            return
        click.echo(f"Started run {record.id} ({record.name}) {launcher.where(record)}. "
                   f"Follow it with: mlbench status {record.id}")
        return
    outcome = session.execute(launcher, plan, _TerminalObserver())
    if plan.group_id and not outcome.cancelled:
        click.echo(f"Compare these {len(plan.requests)} runs: mlbench compare --group {plan.group_id}")
    if outcome.exit_code:
        sys.exit(outcome.exit_code)


class _TerminalObserver:
    """Progress lines while each run trains, and its result sentence when it ends."""

    def __init__(self) -> None:
        self.printer: AllreducePrinter | ProgressPrinter | None = None

    def started(self, record: RunRecord, request: RunRequest | None) -> AllreducePrinter | ProgressPrinter:
        self.printer = (AllreducePrinter(record) if isinstance(get_task(record.task), AllreduceSpec)
                        else ProgressPrinter(record, request))
        self.printer.header()
        return self.printer

    def finished(self, record: RunRecord) -> None:
        assert self.printer is not None
        self.printer.footer(record, summarize(read_run_events(record.run_dir)))


def parse_step_cap(text: str | None) -> int | None:
    """`resume --max-steps`: N (at least 1), 'off' (no cap: NO_STEP_CAP) or not given (None)."""
    if text is None:
        return None
    if text.strip().lower() == "off":
        return NO_STEP_CAP
    try:
        steps = int(text)
    except ValueError:
        raise UsageError(f"--max-steps {text!r}: give a whole number of steps, or off") from None
    if steps < 1:
        raise UsageError("--max-steps must be at least 1")
    return steps


@cli.command()
@click.argument("run_ref", metavar="RUN", shell_complete=complete_runs)
@click.option("--max-steps", metavar="N|off",
              help="Stop the resumed run after step N (counted from the run's start), or never (off) "
                   "[the run's own --max-steps].")
@click.option("--detach", "-d", is_flag=True, help="Resume the run in the background and return at once.")
def resume(run_ref, max_steps, detach) -> None:
    """Continue a stopped, failed or cancelled RUN from its newest complete checkpoint
    (`mlbench run --checkpoint-every`), as the same run: its events go on, run.json records the
    resume. The run's time budget and goal are its own; --max-steps replaces its step cap.

    \b
    Examples:
      mlbench run task2a 2 --checkpoint-every 100steps --max-steps 300
      mlbench resume RUN --max-steps 600
    """
    cap = parse_step_cap(max_steps)
    store = session.open_store()
    record = store.get(run_ref)
    launcher = launcher_of(store, record)
    record = launcher.prepare_resume(launcher.reconcile(record), cap)
    step = RunDocument.load(record.run_dir).config.resume_step
    if detach:
        launcher.start_detached(record)
        click.echo(f"Resumed run {record.id} ({record.name}) from step {step} {launcher.where(record)}. "
                   f"Follow it with: mlbench status {record.id}")
        return
    click.echo(f"Resuming run {record.id} ({record.name}) from step {step}.")
    observer = _TerminalObserver()
    on_event = observer.started(record, None)
    try:
        final = launcher.run_attached(record, on_event)
    except KeyboardInterrupt:
        final = launcher.cancel(record)
    observer.finished(final)
    code = session.Outcome([final]).exit_code
    if code:
        sys.exit(code)


@cli.command()
@click.argument("run_ref", metavar="[RUN]", required=False, shell_complete=complete_runs)
@click.option("--all", "show_all", is_flag=True, help="With no RUN: list every run (default: --limit 30).")
@click.option("--sort", "sort_key", metavar="[-]FIELD",
              help="With no RUN: order the runs by this key of a `status -o json` entry (id, name, "
                   "workers, state, created_at, finished_at, metric_value, time_to_accuracy, ...), "
                   "ascending; -FIELD descending; runs without a value last [-created_at: newest "
                   "first].")
@click.option("--limit", type=click.IntRange(min=1), metavar="N",
              help="With no RUN: list the first N runs in --sort order [30].")
@click.option("--follow", "-f", is_flag=True,
              help="With RUN: print its progress lines as it trains, until it ends; exit with "
                   "`mlbench run`'s code for it (0, 1 failed, 3 missed its goal, 130 cancelled).")
@output_option
def status(run_ref, show_all, sort_key, limit, follow, output) -> None:
    """A table of runs, newest first, or one run's progress, metrics, result and compute vs
    communication."""
    if follow and (not run_ref or output != "table"):
        raise UsageError("--follow follows one run's progress lines: give RUN, and no -o")
    if show_all and limit:
        raise UsageError("--all lists every run and --limit N the first N: give one of them")
    if run_ref and (sort_key or limit or show_all):
        raise UsageError("--sort, --limit and --all choose runs for the list: give no RUN with them")
    if not run_ref:
        listed = api.runs(sort=sort_key or "-created_at", limit=None if show_all else limit or 30)
        runs = [r.to_dict() for r in listed]
        if output != "table":
            emit({"runs": runs}, output)
        elif not runs:
            click.echo("No runs yet. Start one with: mlbench run task1a 2 --light")
        else:
            click.echo(status_table(runs))
        return
    if output != "table":
        emit(api.get(run_ref).to_dict(), output)
        return
    store = session.open_store(read_only=True)
    launcher = launcher_of(store, store.get(run_ref))
    record = launcher.reconcile(store.get(run_ref))
    if follow:
        final = follow_progress(launcher, record)
        sys.exit(session.Outcome([final]).exit_code)
    summary = summarize(read_run_events(record.run_dir))
    print_run_details(record, summary)
    if record.result and record.result.get("kind") == "allreduce":
        print_allreduce_table(record.result)
    print_compression(summary)


@cli.command()
@click.argument("run_ref", metavar="RUN", shell_complete=complete_runs)
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Zip file to write [RUN_ID.zip].")
@click.option("--format", "fmt", type=click.Choice(["zip", "mlperf"]), default="zip", show_default=True,
              help="mlperf: also write an MLPerf :::MLLOG result log next to the zip (.mllog.txt).")
@click.option("--check", is_flag=True,
              help="With --format mlperf: run MLPerf's compliance checker on the log with the rules "
                   "mlbench ships; exit 1 if it fails.")
def download(run_ref, output, fmt, check) -> None:
    """Everything recorded about RUN (spec, environment, result, metrics, logs) as a zip file."""
    from mlbench.results.archive import write_archive
    from mlbench.results.mllog import check_mllog, write_mllog

    if check and fmt != "mlperf":
        raise UsageError("--check checks the MLPerf log: add --format mlperf")
    store = session.open_store(read_only=True)
    record = store.get(run_ref)
    record = launcher_of(store, record).reconcile(record)
    target = Path(output or f"{record.id}.zip")
    if target.parent and not target.parent.exists():
        raise UsageError(f"-o {target}: the folder {target.parent} does not exist")
    path = write_archive(record, target)
    click.echo(f"Wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
    if fmt == "mlperf":
        log = write_mllog(record, target.with_suffix(".mllog.txt"))
        click.echo(f"Wrote {log} (MLPerf :::MLLOG result log)")
        if check:
            passed, said = check_mllog(log)
            if not passed:
                click.echo(f"MLPerf's compliance checker rejects {log}:\n{said}", err=True)
                raise SystemExit(1)
            click.echo(f"MLPerf's compliance checker passes {log} (mlbench's rules).")


@cli.command()
@click.argument("run_ref", metavar="RUN", shell_complete=complete_runs)
def cancel(run_ref) -> None:
    """Stop a running RUN; what it recorded so far is kept."""
    store = session.open_store()
    record = store.get(run_ref)
    if not record.active:
        click.echo(f"Run {record.id} is already {record.state}.")
        return
    final = launcher_of(store, record).cancel(record)
    click.echo(f"Run {final.id} {final.state}.")


@cli.command()
@click.argument("run_refs", metavar="RUN...", nargs=-1, required=True, shell_complete=complete_runs)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def delete(run_refs, yes) -> None:
    """Delete runs and everything they recorded (a running run is cancelled first)."""
    store = session.open_store()
    records = [store.get(ref) for ref in run_refs]
    if not yes and sys.stdin.isatty():
        click.confirm(f"Delete {len(records)} run(s) ({', '.join(r.id for r in records)}) and "
                      "their metrics?", abort=True)
    for record in records:
        if record.active:
            launcher_of(store, record).cancel(record)
        store.delete(record.id)
        click.echo(f"Deleted run {record.id} ({record.name}).")


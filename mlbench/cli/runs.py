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
from mlbench.launch.plan import RunRequest
from mlbench.launch.registry import launcher_of
from mlbench.results.events import read_run_events
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
    detach = options["detach"]
    if options["log_to"] and detach:
        raise UsageError("--log-to writes a run as this command follows it; a detached run is followed by "
                         "nobody: leave out --detach, or `mlbench export RUN --to TOOL DIR` when it has ended")
    if output != "table" and not detach:
        raise UsageError(f"-o {output} prints the record of a run started with --detach: add --detach "
                         "(then `mlbench wait RUN -o json` gives its result)")
    if output != "table" and launch.get("record_only"):
        raise UsageError(f"-o {output} prints a started run's record; --record-only starts none")
    log_to = options.pop("log_to")
    plan = api.plan(task, workers, **options)
    # with -o json the launcher's progress (an image built, a cluster reached) goes to stderr,
    # so that stdout is the document alone
    started = api.start(plan, launch=launch, log_to=log_to, observer=_TerminalObserver(),
                        progress=click.echo if output == "table" else lambda line: click.echo(line, err=True))
    if started.worker_commands:
        for run in started.runs:
            print_worker_commands(run, started.worker_commands[run.id])
        return
    if detach:
        [run] = started.runs
        if output != "table":
            emit(run.entry(), output)
            return
        click.echo(f"Started run {run.id} ({run.name}) {started.where}. Follow it with: mlbench status {run.id}")
        return
    if plan.group_id and not started.cancelled:
        click.echo(f"Compare these {len(plan.requests)} runs: mlbench compare --group {plan.group_id}")
    if started.exit_code:
        sys.exit(started.exit_code)


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


@cli.command()
@click.argument("run_ref", metavar="RUN", shell_complete=complete_runs)
@click.option("--max-steps", metavar="N|off",
              help="Stop the resumed run after step N (counted from the run's start), or never (off) "
                   "[the run's own --max-steps].")
@click.option("--detach", "-d", is_flag=True, help="Resume the run in the background and return at once.")
def resume(run_ref, max_steps, detach) -> None:
    """Continue a stopped, failed or cancelled RUN from its newest valid checkpoint
    (`mlbench run --checkpoint-every`), as the same run: its events go on, run.json records the
    resume. The run's time budget and goal are its own; --max-steps replaces its step cap.

    \b
    Examples:
      mlbench run task2a 2 --checkpoint-every 100steps --max-steps 300
      mlbench resume RUN --max-steps 600
    """
    observer = _TerminalObserver()
    on_event = None

    def started(run: api.Run) -> None:
        nonlocal on_event
        step = RunDocument.load(run.run_dir).config.resume_step
        if detach:
            return
        click.echo(f"Resuming run {run.id} ({run.name}) from step {step}.")
        on_event = observer.started(run.record, None)

    def events(event: dict) -> None:
        if on_event is not None:
            on_event(event)

    final = api.resume(run_ref, max_steps=max_steps, detach=detach, on_start=started, on_event=events)
    if detach:
        step = RunDocument.load(final.run_dir).config.resume_step
        click.echo(f"Resumed run {final.id} ({final.name}) from step {step} {final.where()}. "
                   f"Follow it with: mlbench status {final.id}")
        return
    observer.finished(final.record)
    code = final.exit_code
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
@click.option("--predicted", is_flag=True,
              help="With RUN: its step time as `mlbench predict` predicts it from the other runs, beside the "
                   "measured one (docs/predict.md).")
@output_option
def status(run_ref, show_all, sort_key, limit, follow, predicted, output) -> None:
    """A table of runs, newest first, or one run's progress, metrics, result and compute vs
    communication."""
    if follow and (not run_ref or output != "table"):
        raise UsageError("--follow follows one run's progress lines: give RUN, and no -o")
    if show_all and limit:
        raise UsageError("--all lists every run and --limit N the first N: give one of them")
    if run_ref and (sort_key or limit or show_all):
        raise UsageError("--sort, --limit and --all choose runs for the list: give no RUN with them")
    if predicted and (not run_ref or follow):
        raise UsageError("--predicted predicts one run's step time: give RUN, and no --follow")
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
        document = api.get(run_ref).to_dict()
        if predicted:
            from mlbench.results.predict import predict_run

            store = session.open_store(read_only=True)
            prediction, measured = predict_run(store, store.get(run_ref))
            document["predicted"] = {**prediction.to_dict(), "measured_step_s": measured.step_s,
                                     "measured_communication_s": measured.communication_s}
        emit(document, output)
        return
    run = api.get(run_ref)
    if follow:
        sys.exit(follow_progress(run).exit_code)
    record = run.record
    events = read_run_events(record.run_dir)
    summary = summarize(events)
    print_run_details(record, summary, events)
    if record.result and record.result.get("kind") == "allreduce":
        print_allreduce_table(record.result)
    print_compression(summary)
    if predicted:
        from mlbench.cli.predict import predicted_line

        click.echo(predicted_line(session.open_store(read_only=True), record))


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
    from mlbench.results.mllog import check_mllog, require_checker, run_mllog, write_mllog

    if check and fmt != "mlperf":
        raise UsageError("--check checks the MLPerf log: add --format mlperf")
    if check:
        require_checker()
    store = session.open_store(read_only=True)
    record = store.get(run_ref)
    record = launcher_of(store, record).reconcile(record)
    target = Path(output or f"{record.id}.zip")
    if target.parent and not target.parent.exists():
        raise UsageError(f"-o {target}: the folder {target.parent} does not exist")
    lines = run_mllog(record) if fmt == "mlperf" else []  # a run without a valid log: refused first
    path = write_archive(record, target)
    click.echo(f"Wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
    if fmt == "mlperf":
        log = write_mllog(record, target.with_suffix(".mllog.txt"), lines)
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
    run = api.get(run_ref)
    if not run.active:
        click.echo(f"Run {run.id} is already {run.state}.")
        return
    final = api.cancel(run.id)
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
        deleted = api.delete(record.id, home=store)
        click.echo(f"Deleted run {deleted.id} ({deleted.name}).")


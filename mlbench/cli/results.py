"""`mlbench compare | charts | prices`: several runs as one table, as the four figures, and prices."""

from __future__ import annotations

from collections.abc import Callable

import click

from mlbench.cli import cli
from mlbench.cli.completion import complete_groups, complete_runs, complete_tasks
from mlbench.cli.output import emit, output_option, tabulate
from mlbench.launch.session import open_store
from mlbench.errors import UsageError
from mlbench.results.charts import FORMATS, write_charts
from mlbench.results.compare import MEDIAN, SCORES, Comparison, comparison_of
from mlbench.results.cost import PriceTable
from mlbench.results.exporters import TOOLS, check_library, export_runs
from mlbench.results.report import (compare_headers, compare_notes, compare_row, comparison_document,
                                    difference_lines, differs_in_network, family_heading, had_faults,
                                    is_sweep, sweep_table, bandwidth_matrix)


def _selection(command: Callable) -> Callable:
    """RUN... or --task/--group: which runs a results command reads."""
    command = click.argument("run_refs", metavar="[RUN]...", nargs=-1, shell_complete=complete_runs)(command)
    command = click.option("--group", shell_complete=complete_groups,
                           help="The runs of one `mlbench run` invocation (its group id).")(command)
    return click.option("--task", shell_complete=complete_tasks, help="Every run of this task.")(command)


def _pooling(command: Callable) -> Callable:
    """Which settings runs may differ in and still share a family (pooled on purpose), and how
    a row's repeats are scored."""
    command = click.option("--score", type=click.Choice(SCORES), default=MEDIAN, show_default=True,
                           help="A row's time to goal and the speedup made of it: the median of its "
                                "repeats, or MLPerf's score (from at least 5 runs, the mean without the "
                                "fastest and the slowest).")(command)
    return click.option("--pool", "pool", multiple=True, metavar="KEY",
                        help="Let runs that differ in this setting share a row (repeatable): a key of the "
                             "runs' fingerprint (data, hardware, opt.period, set.momentum, set. for every task "
                             "setting); said above the tables. Without it runs share a row only when "
                             "everything that changes what they compute is equal.")(command)


def pricing_options(command: Callable) -> Callable:
    """How runs are priced: a price per node-hour, directly or from the price table."""
    command = click.option("--prices", "prices_file", type=click.Path(dir_okay=False),
                           help="A price file (CSV or YAML) that adds to or replaces the shipped "
                                "table [also $MLBENCH_PRICES].")(command)
    command = click.option("--price-per-hour", type=float, metavar="USD",
                           help="Price every run at USD per node-hour.")(command)
    return click.option("--instance", metavar="NAME[+NAME]",
                        help="Price every run as if on this instance type from the price table, e.g. "
                             "n1-standard-4:preemptible+nvidia-tesla-k80:preemptible "
                             "(`mlbench prices`).")(command)


def _comparison(run_refs, task, group, instance, price_per_hour, prices_file, pool=(), score=MEDIAN) -> Comparison:
    # the store `status` reads (the current cluster's, else this machine's); only finished runs
    # count, so a run still marked running is left out whether or not it is alive
    return comparison_of(open_store(read_only=True), tuple(run_refs), task, group, instance, price_per_hour,
                         prices_file, pool=tuple(pool), score=score)


@cli.command()
@_selection
@pricing_options
@_pooling
@output_option
def compare(run_refs, task, group, instance, price_per_hour, prices_file, pool, score, output) -> None:
    """Compare runs of one task: time to goal over repeats, speedup, efficiency, compute vs
    communication and cost, per worker count.

    \b
    Examples:
      mlbench compare --task task1a
      mlbench compare 3f2a9c1d 7b0e44aa --instance n1-standard-4
      mlbench compare --group 5d1e20c4 --price-per-hour 0.19
    """
    comparison = _comparison(run_refs, task, group, instance, price_per_hour, prices_file, pool, score)
    if output != "table":
        emit(comparison_document(comparison), output)
        return
    emulated = differs_in_network(comparison)
    sweep = is_sweep(comparison)
    faults = had_faults(comparison)
    differing = tuple(key for key, _ in comparison.differences())
    for line in difference_lines(comparison):
        click.echo(line)
    for i, (family, groups) in enumerate(comparison.families().items()):
        if i or differing or comparison.pooled:
            click.echo("")
        click.echo(family_heading(family, emulated, faults, differing, comparison.pooled))
        click.echo(tabulate([compare_row(g, emulated, faults, score) for g in groups], disable_numparse=True,
                            headers=compare_headers(emulated, sweep, faults, comparison.task, score)))
    matrix = bandwidth_matrix(comparison)
    if matrix is not None:
        click.echo("\nBy bandwidth (median of the repeats; bytes each worker sent per step):")
        click.echo(tabulate(matrix[1], headers=matrix[0], disable_numparse=True))
    if sweep:
        headers, rows = sweep_table(comparison)
        click.echo("\nBy message size (median of the repeats):")
        click.echo(tabulate(rows, headers=headers, disable_numparse=True))
    click.echo("")
    for note in compare_notes(comparison):
        click.echo(note)


@cli.command()
@_selection
@pricing_options
@_pooling
@click.option("--out-dir", "-d", "out_dir", type=click.Path(file_okay=False),
              help="Folder for the charts [charts].")
@click.option("-o", "--output", "old_out_dir", type=click.Path(file_okay=False), hidden=True,
              help="Deprecated spelling of --out-dir (-o is an output format in the other commands).")
@click.option("--format", "formats", default=",".join(FORMATS), show_default=True,
              help="Image formats, comma-separated (png, svg, pdf).")
def charts(run_refs, task, group, instance, price_per_hour, prices_file, pool, score, out_dir, old_out_dir,
           formats) -> None:
    """Draw the four figures of the original mlbench from runs of one task: speedup vs workers,
    cost vs workers, loss and accuracy vs time per worker count, communication vs computation.

    \b
    Examples:
      mlbench charts --task task1a -d charts/
      mlbench charts --group 5d1e20c4 --instance n1-standard-4:preemptible --format png
    """
    if old_out_dir is not None:
        if out_dir is not None:
            raise UsageError("-o/--output is the old spelling of --out-dir/-d: give one of them")
        click.echo(f"Warning: `charts -o DIR` is deprecated (-o is an output format elsewhere); "
                   f"use --out-dir {old_out_dir} or -d {old_out_dir}.", err=True)
        out_dir = old_out_dir
    out_dir = out_dir or "charts"
    chosen = tuple(f.strip().lower() for f in formats.split(",") if f.strip())
    unknown = sorted(set(chosen) - {"png", "svg", "pdf"})
    if not chosen or unknown:
        raise UsageError(f"--format {formats}: choose from png, svg, pdf (comma-separated)")
    comparison = _comparison(run_refs, task, group, instance, price_per_hour, prices_file, pool, score)
    paths = write_charts(comparison, out_dir, chosen)
    click.echo(f"Wrote {len(paths)} files to {out_dir}:")
    for path in paths:
        click.echo(f"  {path.name} ({path.stat().st_size / 1024:.0f} KiB)")
    if comparison.skipped:
        click.echo(f"Left out {len(comparison.skipped)} run(s) that did not finish: "
                   + ", ".join(f"{r.id} ({r.state})" for r in comparison.skipped) + ".")


@cli.command()
@click.option("--prices", "prices_file", type=click.Path(dir_okay=False),
              help="A price file that adds to or replaces the shipped table [also $MLBENCH_PRICES].")
@output_option
def prices(prices_file, output) -> None:
    """The price table that --instance reads: USD per node-hour (or per GPU-hour for GPUs)."""
    table = PriceTable.load(prices_file)
    if output != "table":
        emit({"prices": [p.to_dict() for p in sorted(table, key=lambda p: p.name)]}, output)
        return
    rows = [[p.name, f"{p.usd_per_hour:.4g}", p.kind, p.provider, p.region, p.checked]
            for p in sorted(table, key=lambda p: (p.provider, p.kind, p.name))]
    click.echo(tabulate(rows, headers=["NAME", "USD/HOUR", "KIND", "PROVIDER", "REGION", "CHECKED"],
                        disable_numparse=True))
    click.echo("\nCombine a machine and its GPUs with '+', e.g. "
               "--instance n1-standard-4:preemptible+nvidia-tesla-k80:preemptible.")


@cli.command()
@click.argument("run_refs", metavar="RUN...", nargs=-1, required=True, shell_complete=complete_runs)
@click.option("--to", "tool", type=click.Choice(TOOLS), required=True,
              help="The tool whose files to write (each needs its extra: pip install 'mlbench-suite[TOOL]').")
@click.argument("out_dir", metavar="DIR", type=click.Path(file_okay=False))
def export(run_refs, tool, out_dir) -> None:
    """Write ended runs in the files of TensorBoard, MLflow or Weights & Biases: every metric
    they recorded (per worker where each worker records it), their summary and result, and
    their configuration as hyper-parameters (docs/exporters.md).

    \b
    tensorboard: DIR/RUN_ID/ event files          tensorboard --logdir DIR
    mlflow:      a local MLflow store (file:DIR)  MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri DIR
    wandb:       DIR/wandb/offline-run-*-RUN_ID   wandb sync DIR/wandb/offline-run-*

    \b
    Examples:
      mlbench export 3f2a9c1d --to tensorboard tb/
      mlbench export 3f2a9c1d 7b0e44aa --to mlflow mlruns/
    """
    check_library(tool)
    store = open_store(read_only=True)
    records = [store.get(ref) for ref in run_refs]
    for location in export_runs(records, tool, out_dir):
        click.echo(f"Exported to {location}")

"""`mlbench check-optimizer`: is an optimizer (a plug-in, or a built-in) sound before it is benchmarked?"""

from __future__ import annotations

import importlib
import tempfile
from pathlib import Path

import click

from mlbench.cli import cli
from mlbench.launch.options import parse_optimizer_options
from mlbench.errors import UsageError

#: Imported once before the processes fork (torch.optim's first use imports torch._dynamo: seconds).
CATALOG = "mlbench.optim.catalog"


@cli.command("check-optimizer")
@click.argument("specs", nargs=-1, required=True, metavar="SPEC...")
@click.option("--opt", "opts", multiple=True, metavar="KEY=VALUE",
              help="Optimizer option, e.g. --opt rank=2 (with one SPEC only).")
@click.option("--workers", type=click.IntRange(2, 16), default=2, show_default=True,
              help="Worker processes (gloo on 127.0.0.1).")
@click.option("--steps", type=click.IntRange(1, 1000), default=5, show_default=True,
              help="Training steps of each run.")
@click.option("--seed", type=click.IntRange(0, 2**31 - 1), default=0, show_default=True)
@click.option("--timeout", type=click.FloatRange(1, 3600), default=60, show_default=True,
              help="Seconds a collective may wait for a rank (one that skips a collective waits this long).")
@click.pass_context
def check_optimizer(ctx: click.Context, specs: tuple[str, ...], opts: tuple[str, ...], workers: int,
                    steps: int, seed: int, timeout: float) -> None:
    """Run the checks the built-in optimizers pass against SPEC (FILE.py:CLASS,
    package.module:CLASS, an installed plug-in's or a built-in's name): k workers against one
    process with k times the batch (for an optimizer that claims to be exact), bytes reported
    against bytes sent, the same model on every rank (or the consensus distance), determinism,
    no NaN. One line per check; exit code 1 when one fails (docs/plugins.md)."""
    from mlbench.launch.forked import forking_allowed
    from mlbench.optim.check import CHECKED, Settings, prepare, run_checks

    if opts and len(specs) > 1:
        raise UsageError("--opt applies to one optimizer: give one SPEC with --opt")
    options = parse_optimizer_options(opts)
    settings = Settings(workers=workers, steps=steps, seed=seed, timeout_s=timeout)
    forking_allowed(CATALOG)   # imports torch and the optimizers before a plug-in may compute (see below)
    importlib.import_module("torch._dynamo")   # what torch.optim's first step imports: once, not per process
    failed = False
    with tempfile.TemporaryDirectory(prefix="mlbench-check-") as tmp:
        folders = [Path(tmp) / f"optimizer-{i}" for i in range(len(specs))]
        subjects = []
        for spec, folder in zip(specs, folders):   # every refusal before anything runs
            folder.mkdir()
            subjects.append(prepare(spec, options, workers, folder))
        import multiprocessing

        # forked processes start in milliseconds; only from a process whose torch computed nothing
        context = multiprocessing.get_context("fork" if forking_allowed(CATALOG) else "spawn")
        for subject, folder in zip(subjects, folders):
            source = f" (plug-in {subject.spec})" if subject.plugin is not None else ""
            click.echo(f"{subject.label}{source}: {workers} workers x batch {settings.batch}, {steps} steps "
                       f"of {CHECKED}")
            for result in run_checks(subject, settings, context, folder):
                failed |= result.status == "FAIL"
                click.echo(f"  {result.status:<5} {result.name:<12} {result.detail}")
    if failed:
        ctx.exit(1)

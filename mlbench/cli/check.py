"""`mlbench check-optimizer`: is an optimizer (a plug-in, or a built-in) sound before it is benchmarked?"""

from __future__ import annotations

import importlib
import tempfile
from pathlib import Path
from typing import Any

import click

from mlbench.cli import cli
from mlbench.launch.options import parse_optimizer_options
from mlbench.errors import UsageError

#: Imported once before the processes fork (torch.optim's first use imports torch._dynamo: seconds).
CATALOG = "mlbench.optim.catalog"


def parse_workers(text: str | None) -> tuple[int, ...] | None:
    """``--workers 4`` or ``--workers 2,4``: the worker counts, ascending (None: the default's)."""
    if text is None:
        return None
    counts = set()
    for part in text.split(","):
        try:
            count = int(part.strip())
        except ValueError:
            raise UsageError(f"--workers {text}: expected worker counts such as 4 or 2,4") from None
        if not 2 <= count <= 16:
            raise UsageError(f"--workers {text}: each count must be in [2, 16]")
        counts.add(count)
    return tuple(sorted(counts))


@cli.command("check-optimizer")
@click.argument("specs", nargs=-1, required=True, metavar="SPEC...")
@click.option("--opt", "opts", multiple=True, metavar="KEY=VALUE",
              help="Optimizer option, e.g. --opt rank=2 (with one SPEC only).")
@click.option("--workers", "workers_text", metavar="K[,K...]", default=None,
              help="Worker processes (gloo on 127.0.0.1), one count or a comma list, each checked "
                   "[default: 2,4, leaving out a count the options refuse].")
@click.option("--steps", type=click.IntRange(1, 1000), default=20, show_default=True,
              help="Training steps of each run, at least (raised to two of the method's periods).")
@click.option("--seed", type=click.IntRange(0, 2**31 - 1), default=0, show_default=True)
@click.option("--timeout", type=click.FloatRange(1, 3600), default=60, show_default=True,
              help="Seconds a collective may wait for a rank (one that skips a collective waits this long).")
@click.pass_context
def check_optimizer(ctx: click.Context, specs: tuple[str, ...], opts: tuple[str, ...], workers_text: str | None,
                    steps: int, seed: int, timeout: float) -> None:
    """Run the checks the built-in optimizers pass against SPEC (FILE.py:CLASS,
    package.module:CLASS, an installed plug-in's or a built-in's name), at 2 and at 4 workers:
    k workers against one process with k times the batch (for an optimizer that claims to be
    exact), each rank's bytes reported against its bytes sent, the same model on every rank (or
    the consensus distance), evaluation that gives the parameters back, communication in every
    period, progress of the evaluated model, memory growth per step, torch's random stream left
    alone, determinism, no NaN. One line per check and a last line naming the failed ones; exit
    code 1 when one fails (docs/plugins.md)."""
    from mlbench.launch.forked import forking_allowed
    from mlbench.checks.optimizer import CHECKED, describe_settings, run_checks

    if opts and len(specs) > 1:
        raise UsageError("--opt applies to one optimizer: give one SPEC with --opt")
    options = parse_optimizer_options(opts)
    chosen = parse_workers(workers_text)
    forking_allowed(CATALOG)   # imports torch and the optimizers before a plug-in may compute (see below)
    importlib.import_module("torch._dynamo")   # what torch.optim's first step imports: once, not per process
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="mlbench-check-") as tmp:
        folders = [Path(tmp) / f"optimizer-{i}" for i in range(len(specs))]
        plans = []
        for spec, folder in zip(specs, folders):   # every refusal before anything runs
            folder.mkdir()
            subject, runs = _plan(spec, options, chosen, steps, seed, timeout, folder)
            plans.append((subject, folder, runs))
        import multiprocessing

        # forked processes start in milliseconds; only from a process whose torch computed nothing
        context = multiprocessing.get_context("fork" if forking_allowed(CATALOG) else "spawn")
        for subject, folder, runs in plans:
            source = f" (plug-in {subject.spec})" if subject.plugin is not None else ""
            broken: dict[str, list[int]] = {}
            for settings in runs:
                if isinstance(settings, str):   # a default count its options refuse
                    click.echo(settings)
                    continue
                scratch = folder / f"workers-{settings.workers}"
                scratch.mkdir()
                click.echo(f"{subject.label}{source}: {describe_settings(settings, subject)} of {CHECKED}")
                for result in run_checks(subject, settings, context, scratch):
                    if result.status == "FAIL":
                        broken.setdefault(result.name, []).append(settings.workers)
                    click.echo(f"  {result.status:<5} {result.name:<13} {result.detail}")
            failed += [f"{subject.label} {name} ({', '.join(map(str, where))} workers)"
                       for name, where in broken.items()]
    click.echo(f"Failed checks: {'; '.join(failed)}" if failed else "No check failed.")
    if failed:
        ctx.exit(1)


def _plan(spec: str, options: dict[str, str], chosen: tuple[int, ...] | None, steps: int, seed: int,
          timeout: float, folder: Path) -> tuple[Any, list[Any]]:
    """The optimizer and the set-up of each of its runs. A worker count given with --workers that
    its options refuse is the refusal; of the default counts, one they refuse (a topology of
    edges among 2 ranks) is the line that says so instead of its run, and only none left is a
    refusal."""
    from mlbench.checks.optimizer import DEFAULT_WORKERS, prepare, settings_for

    counts = chosen or DEFAULT_WORKERS
    refusals: list[UsageError] = []
    for count in counts:
        try:
            subject = prepare(spec, options, count, folder)
            break
        except UsageError as err:
            if chosen:
                raise
            refusals.append(err)
    else:
        raise refusals[0]
    runs: list[Any] = []
    for count in counts:
        try:
            runs.append(settings_for(subject, count, steps, seed, timeout))
        except UsageError as err:
            if chosen:
                raise
            runs.append(f"{subject.label}: not at {count} workers: {err}")
    return subject, runs

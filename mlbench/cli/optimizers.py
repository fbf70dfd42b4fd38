"""`mlbench optimizers`: every distributed optimizer, its options and its paper."""

from __future__ import annotations

from typing import Any

import click

from mlbench.cli import cli
from mlbench.cli.output import emit, output_option, tabulate
from mlbench.results.summary import RunSummary


def _default(value: Any) -> str:
    if value is None:   # an option that is unset unless given (an absolute rate)
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)


@cli.command()
@click.argument("name", required=False)
@output_option
def optimizers(name: str | None, output) -> None:
    """The distributed optimizers for `mlbench run --optimizer NAME --opt KEY=VALUE`; with NAME,
    that one alone (an installed plug-in, FILE.py:CLASS or package.module:CLASS is imported to
    show its options: a plug-in is code that runs as you)."""
    from mlbench.optim.descriptors import describe_optimizers
    from mlbench.optim.plugins import describe_one, describe_plugins
    from mlbench.tasks.registry import reference_optimizers

    references = reference_optimizers()
    described = [describe_one(name, references)] if name else describe_optimizers(references) + describe_plugins()
    if output != "table":
        emit({"optimizers": described}, output)
        return
    for info in described:
        plugin = info.get("plugin")
        if plugin is not None and "error" in plugin:
            click.echo(f"{info['name']} (plug-in from {_source(plugin)}): cannot be used: {plugin['error']}\n")
            continue
        if plugin is not None and "summary" not in info:   # listed, not imported
            click.echo(f"{info['name']} (plug-in, open division; from {_source(plugin)}, sha256 "
                       f"{plugin['sha256'][:12]})")
            click.echo(f"  Not imported: `mlbench optimizers {info['name']}` runs its code to show its options\n")
            continue
        tasks = info.get("reference_of") or []
        division = f"closed division: the reference of {', '.join(tasks)}" if tasks else "open division"
        if plugin is not None:
            division = f"plug-in, open division; from {_source(plugin)}, sha256 {plugin['sha256'][:12]}"
        click.echo(f"{info['name']} ({division})")
        click.echo(f"  {info['summary']}")
        click.echo(f"  Reference: {info['reference']}")
        if info["options"]:
            rows = [[f"--opt {o['name']}=", _default(o["default"]), o["help"]] for o in info["options"]]
            table = tabulate(rows, headers=["option", "default", ""], tablefmt="plain", maxcolwidths=[None, None, 70])
            click.echo("  " + table.replace("\n", "\n  "))
        click.echo("")
    if name:
        return
    click.echo("Example: mlbench run task1a 4 --optimizer powersgd --opt rank=2")
    click.echo("Your own: --optimizer FILE.py:CLASS, package.module:CLASS, or an installed plug-in's "
               "name (docs/plugins.md)")


def _source(plugin: dict[str, Any]) -> str:
    """``entry point NAME = VALUE of DIST`` (an installed plug-in) or the file it was read from."""
    dist = f" of {plugin['distribution']}" if plugin.get("distribution") else ""
    if "entry_point" not in plugin:
        return f"{plugin['origin']}{dist}"
    return f"entry point {plugin['entry_point']} = {plugin['value']}{dist}"


def print_compression(summary: RunSummary) -> None:
    """One line: bytes sent against the reference all-reduce's (for `mlbench status RUN`)."""
    ratio = summary.compression_ratio
    if ratio is not None:
        click.echo(f"\nCompression: the reference all-reduce would have sent {ratio:.2f}x the bytes "
                   "this run sent")

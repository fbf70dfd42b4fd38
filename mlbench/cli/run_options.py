"""`mlbench run`'s options as click options, made from their one declaration
(:data:`mlbench.launch.options.RUN_OPTIONS`): the command receives each value under the option's
API name, which is what :func:`mlbench.api.plan` takes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from mlbench.launch.options import RUN_OPTIONS, RunOption


def click_option(option: RunOption) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """One declared option as a click option (its value passed as ``option.name``)."""
    names = [option.flag, *([option.short] if option.short else []), option.name]
    if option.is_flag:
        if option.negated:  # --no-stop: stop_at_goal=False
            return click.option(*names, flag_value=False, default=True, show_default=False, help=option.description)
        return click.option(*names, is_flag=True, help=option.description)
    kind: Any = (click.Choice(option.choices) if option.choices is not None
                 else click.Path(file_okay=False) if option.folder else option.kind)
    return click.option(*names, type=kind, multiple=option.multiple, metavar=option.metavar,
                        default=option.default if not option.multiple else None, help=option.description)


def run_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add every option of `mlbench run` to a click command, in their declared order."""
    for option in reversed(RUN_OPTIONS):
        command = click_option(option)(command)
    return command

"""`mlbench run`'s launcher options, as the launchers declare them, and what a launcher that only
records runs prints.

Every registered launcher declares the option that chooses it and its own options
(:class:`~mlbench.launch.base.LauncherOption`); :func:`launcher_options` adds them all to a click
command, which then receives one value, ``launch``: a dict of their values by name, for
:func:`mlbench.launch.registry.choose`.
"""

from __future__ import annotations

import functools
from typing import Any
from collections.abc import Callable

import click

from mlbench.api import RunInfo
from mlbench.launch.base import LauncherOption
from mlbench.launch import registry


def _click_option(option: LauncherOption) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    if option.is_flag:
        return click.option(option.flag, option.name, is_flag=True, help=option.help)
    return click.option(option.flag, option.name, type=option.type, multiple=option.multiple,
                        metavar=option.metavar, help=option.help)


def launcher_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add every launcher's options to a click command, passed on as ``launch``."""
    declared = registry.launcher_options()

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs["launch"] = {option.name: kwargs.pop(option.name) for option in declared}
        return command(*args, **kwargs)

    decorated: Callable[..., Any] = wrapper
    for option in reversed(declared):
        decorated = _click_option(option)(decorated)
    return decorated


def print_worker_commands(run: RunInfo, commands: list[tuple[str, str]]) -> None:
    """What a launcher that only records runs says: how to start the run's workers (``commands``:
    its :meth:`~mlbench.launch.base.Launcher.worker_commands`)."""
    click.echo(f"Recorded run {run.id} ({run.name}) in {run.run_dir}.")
    click.echo(f"Start its {run.workers} worker(s) with a launcher of your own:")
    for where, command in commands:
        click.echo(f"  # {where}\n  {command}")
    click.echo(f"Follow it with: mlbench status {run.id}")

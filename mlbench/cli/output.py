"""`-o table|json|yaml`: the commands that list things print them for people or for scripts.

The data comes from the library (``run_details``, ``comparison_document``, ``spec_to_dict``,
``Price.to_dict``, ``ClusterRow.to_dict``, ...); this module only chooses the notation. JSON is
printed with two-space indentation, YAML in block style with the keys in the library's order.
"""

from __future__ import annotations

import json
import math
from typing import Any
from collections.abc import Callable

import click

FORMATS = ("table", "json", "yaml")


def output_option(command: Callable) -> Callable:
    """The ``-o/--output`` option of a listing command."""
    return click.option("-o", "--output", "output", type=click.Choice(FORMATS), default="table",
                        show_default=True,
                        help="table for people; json or yaml for scripts (keys: README, "
                             "\"Machine-readable output\").")(command)


def tabulate(*args: Any, **kwargs: Any) -> str:
    """tabulate.tabulate, imported when a table is printed: tabulate imports wcwidth and
    importlib.metadata, a fifth of the CLI's start-up, which `-o json` and completion never need."""
    from tabulate import tabulate as table

    return table(*args, **kwargs)


def plain(value: Any) -> Any:
    """``value`` with tuples as lists and non-finite floats as None: valid JSON and plain YAML."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def emit(data: Any, fmt: str) -> None:
    """Print ``data`` as JSON or YAML (``fmt`` "json" or "yaml")."""
    data = plain(data)
    if fmt == "json":
        click.echo(json.dumps(data, indent=2, allow_nan=False))
    else:
        import yaml

        click.echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), nl=False)

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
#: The ``schema_version`` of every JSON or YAML document the CLI prints: raised when a key is
#: renamed or dropped, or its meaning changes (adding a key does not raise it), so that a script
#: can refuse a document it does not understand instead of misreading it.
SCHEMA_VERSION = 1
_HELP = "table for people; json or yaml for scripts (keys: docs/scripting.md)."


def output_option(command: Callable | None = None, *, help: str = _HELP) -> Callable:
    """The ``-o/--output`` option: the notation a command prints in. Used bare
    (``@output_option``) or with its own help (``@output_option(help=...)``)."""
    option = click.option("-o", "--output", "output", type=click.Choice(FORMATS), default="table",
                          show_default=True, help=help)
    return option if command is None else option(command)


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


def emit(data: dict[str, Any], fmt: str) -> None:
    """Print the document ``data`` as JSON or YAML (``fmt`` "json" or "yaml"), with
    ``schema_version`` as its last key (a run's record keeps its id first)."""
    data = plain({**data, "schema_version": SCHEMA_VERSION})
    if fmt == "json":
        click.echo(json.dumps(data, indent=2, allow_nan=False))
    else:
        import yaml

        click.echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), nl=False)

"""How task 0a (the all-reduce benchmark) looks on the terminal: one line per measurement as it
arrives, then the peak; and its table in ``mlbench status RUN``."""

from __future__ import annotations

from typing import Any

import click

from mlbench.cli.output import tabulate
from mlbench.results.store import RunRecord
from mlbench.cli.format import network_note
from mlbench.results.summary import RunSummary
from mlbench.run_config import RunDocument
from mlbench.results.report import describe_result
from mlbench.tasks.task0a.sweep import TABLE_HEADERS, message_sizes, table_row
from mlbench.tasks.spec import AllreduceSpec

_WIDTHS = (5, 10, 11, 5, 12, 13, 13, 7)


def _elements(n: int) -> str:
    """1e8 rather than 100000000 (or 1e+08)."""
    mantissa, exponent = f"{n:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}" if float(f"{n:.0e}") == n and n >= 1000 else str(n)


def _line(cells: list[Any] | tuple[Any, ...]) -> str:
    return "  ".join(f"{c!s:>{w}}" for c, w in zip(cells, _WIDTHS))


class AllreducePrinter:
    """The launcher's event callback for a task-0a run (same interface as ProgressPrinter)."""

    def __init__(self, run: RunRecord):
        self.run = run

    def header(self) -> None:
        config = RunDocument.load(self.run.run_dir).config
        spec = config.task
        assert isinstance(spec, AllreduceSpec)
        sizes = message_sizes(spec.max_size)
        click.echo(f"Run {self.run.id} ({self.run.name}): task0a all-reduce sweep, {self.run.workers} "
                   f"worker(s), {config.device}/{config.backend}, {sizes[0]}..{_elements(sizes[-1])} "
                   f"elements, {', '.join(spec.dtypes)}{network_note(self.run)}")
        click.echo(_line(TABLE_HEADERS))

    def __call__(self, event: dict[str, Any]) -> None:
        if event["name"] == "allreduce":
            click.echo(_line(table_row(event["value"])))
        elif event["name"] == "error":
            click.echo(f"  worker {event['rank']}: {event['value']}", err=True)

    def footer(self, final: RunRecord, summary: RunSummary) -> None:
        if final.state != "finished" or not final.result:
            click.echo(f"Run {final.id} {final.state}: {final.reason}", err=True)
            return
        click.echo(describe_result(final.result) + f" Details: mlbench status {final.id}")


def print_allreduce_table(result: dict[str, Any]) -> None:
    """The whole sweep of a finished task-0a run (for `mlbench status RUN`, under the details
    whose result line gives its peak)."""
    click.echo("\nAll-reduce sweep (time: mean per operation over ranks; nccl-tests' algbw and busbw):")
    click.echo(tabulate([table_row(r) for r in result["rows"]], headers=TABLE_HEADERS,
                        disable_numparse=True, colalign=("left",) + ("right",) * 7))


def task_rows(params: dict[str, Any]) -> list[list[str]]:
    """Task 0a's specification for `mlbench tasks`."""
    return [["messages", f"1 .. {_elements(params['max_size'])} elements, a power of 10 each (--max-size caps)"],
            ["types", ", ".join(params["dtypes"])],
            ["repetitions", f"up to {params['warmup']} warm-up and {params['iterations']} timed per size, "
                            f"about {params['seconds_per_size']:g} s each (--set warmup, iterations, "
                            "seconds_per_size)"],
            ["reports", "time per all-reduce, algorithm and bus bandwidth per size (nccl-tests)"]]

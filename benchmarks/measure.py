"""How every script in ``benchmarks/`` measures: baseline and mlbench interleaved, repeated, and
reported as the median with its range.

These hosts scatter by +-20% from one minute to the next (a noisy neighbour, a frequency step), so
a figure taken once, or a baseline taken minutes before the thing it is compared with, says more
about the moment than about the code. :func:`interleave` runs one repeat of every case before the
next repeat of any, so a change of load hits every case alike; :func:`spread` reports the median
and the fastest and slowest repeat, and :func:`ratio_spread` the ratio of two cases repeat by
repeat (each pair measured back to back), which is what "x times the plain loop" means here.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import sys
from collections.abc import Callable

#: Repeats unless a script is told otherwise: enough for a median that one outlier cannot move.
DEFAULT_REPEATS = 5


def interleave(cases: dict[str, Callable[[], float]], repeats: int = DEFAULT_REPEATS) -> dict[str, list[float]]:
    """Each case's figure, ``repeats`` times, taken round by round in the order given."""
    results: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, measure in cases.items():
            results[name].append(measure())
    return results


def spread(values: list[float], fmt: str = "{:,.0f}") -> str:
    """``median (min-max)``, e.g. ``781 (744-802)``."""
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def ratio_spread(numerators: list[float], denominators: list[float]) -> str:
    """The ratio of two interleaved cases per round, as ``1.02x (0.95-1.10x)``."""
    ratios = [n / d for n, d in zip(numerators, denominators, strict=True)]
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}x)"


def machine_line(extra: str = "") -> str:
    """The first line of a script's output: the date, the machine and what else decides the figures."""
    cpu = platform.processor() or platform.machine()
    load = os.getloadavg()[0]
    parts = [str(datetime.date.today()), f"{cpu}, {os.cpu_count()} cores, load average {load:.1f}",
             f"Python {sys.version.split()[0]}"]
    return "# " + " | ".join(parts + ([extra] if extra else []))

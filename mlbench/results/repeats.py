"""Statistics over repeated runs of one configuration: what a trustworthy time to accuracy is.

One run's time to accuracy moves with the seed (initialisation, data order, augmentation) and with
the machine's load, so a single number is an anecdote. MLPerf Training therefore asks for several
runs per result and scores them with the *olympic mean*: drop the fastest and the slowest run and
average the rest. A run that missed the goal has no time to accuracy; it counts as infinitely slow
(as MLPerf scores a non-converged run: the slowest), so the olympic mean may drop it as the worst
run, but it can never make a result look better, and the count of converged runs is always
reported beside the figures. Nothing is silently left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import mean, median
from collections.abc import Iterable

#: How a run that did not reach the goal enters the statistics: as an infinitely slow run.
NOT_CONVERGED = math.inf


@dataclass(frozen=True)
class RepeatStats:
    """Median, range and olympic mean of one measurement over repeated runs.

    ``values`` are sorted; a run without a value (goal missed) is ``inf``. Every statistic is
    ``inf`` when the runs that did not converge decide it (e.g. the median when half or more missed
    the goal), which the CLI prints as "not converged" rather than as a number.
    """

    values: tuple[float, ...]

    @property
    def runs(self) -> int:
        return len(self.values)

    @property
    def converged(self) -> int:
        return sum(1 for v in self.values if math.isfinite(v))

    @property
    def median(self) -> float:
        return median(self.values) if self.values else NOT_CONVERGED

    @property
    def minimum(self) -> float:
        return self.values[0] if self.values else NOT_CONVERGED

    @property
    def maximum(self) -> float:
        return self.values[-1] if self.values else NOT_CONVERGED

    @property
    def olympic_mean(self) -> float:
        """The mean without the best and the worst run (all runs when there are fewer than 3)."""
        kept = self.values[1:-1] if len(self.values) >= 3 else self.values
        if not kept or not all(math.isfinite(v) for v in kept):
            return NOT_CONVERGED
        return mean(kept)


def repeat_stats(values: Iterable[float | None]) -> RepeatStats:
    """Statistics of repeated measurements; ``None`` (goal not reached) counts as not converged."""
    return RepeatStats(tuple(sorted(NOT_CONVERGED if v is None else float(v) for v in values)))

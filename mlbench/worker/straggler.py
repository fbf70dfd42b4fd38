"""``--inject slow:rank=R,factor=F``: this worker made a straggler, by itself.

A slowed rank sleeps, after each training step, (F - 1) times the seconds that step took, so
that its steps take F times as long as they would (its peers then wait for it in the next
collective, as they would for a slower machine). The worker does this itself rather than the
supervisor throttling the process from outside: a SIGSTOP/SIGCONT duty cycle slows a process
only in coarse slices of the supervisor's clock and stops its heartbeat with it, and cgroup v2's
``cpu.max`` needs a delegated cgroup that an unprivileged run (CI, a container, a laptop) does
not have. The step's time includes the rank's share of the collective, which for the rank the
others wait for is the transfer alone. The sleep is counted in ``slowed_s`` and recorded by the
trainer as the ``fault/slowed`` metric, so that the run's per-rank step times
(:mod:`mlbench.results.goodput`) show the straggler as its compute.

When the slowdown applies follows from the schedule (:func:`mlbench.results.faults.slow_factor`)
on the fault clock the supervisor hands over in ``MLBENCH_FAULT_CLOCK`` (the worker's own start
when there is none).
"""

from __future__ import annotations

import os
import time
from typing import Any

from mlbench.results.faults import FAULT_CLOCK_ENV, SLOW, slow_factor


class Straggler:
    """The slowdown of one rank."""

    def __init__(self, schedules: list[dict[str, Any]], rank: int, clock_start: float | None = None):
        self.schedules = [s for s in schedules if s.get("kind") == SLOW and s.get("rank") == rank]
        self.rank = rank
        self.clock_start = time.time() if clock_start is None else clock_start
        self.slowed_s = 0.0   # seconds slept since the last :meth:`take_slowed`

    @classmethod
    def of(cls, schedules: list[dict[str, Any]], rank: int) -> Straggler | None:
        """The rank's straggler, or None when no schedule slows it."""
        if not any(s.get("kind") == SLOW and s.get("rank") == rank for s in schedules):
            return None
        try:
            start: float | None = float(os.environ[FAULT_CLOCK_ENV])
        except (KeyError, ValueError):
            start = None
        return cls(schedules, rank, start)

    def after_step(self, step_seconds: float) -> None:
        """Sleep (factor - 1) x ``step_seconds`` while a slowdown applies."""
        factor = slow_factor(self.schedules, self.rank, time.time() - self.clock_start)
        if factor > 1.0 and step_seconds > 0:
            pause = (factor - 1.0) * step_seconds
            time.sleep(pause)
            self.slowed_s += pause

    def take_slowed(self) -> float:
        """The seconds slept since the last call."""
        slowed, self.slowed_s = self.slowed_s, 0.0
        return slowed

"""When a run writes its resumable checkpoints, and what that adds to each training step.

``--checkpoint-every`` takes a step count (``500steps``), a duration (``2m``) or ``auto[:MTBF]``
(Daly's optimum interval for the measured checkpoint cost and a mean time between failures).
The workers (:mod:`mlbench.worker.trainer`) write one when the rule says; ``mlbench predict``
prices the same rule (:class:`CheckpointRule`). This module imports no torch, so that the
prediction, the reports and the launchers can read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: Target seconds of training between two checks of the time budget, the time-based checkpoint
#: and a stop request: the workers agree on them at a step count, so a checkpoint by duration
#: is written at the first check after its interval.
BUDGET_CHECK_SECONDS = 0.25
#: The most steps between two such checks.
MAX_STEPS_BETWEEN_CHECKS = 1000


def steps_between_checks(step_s: float) -> int:
    """Steps between two clock checks at ``step_s`` seconds a step: about
    :data:`BUDGET_CHECK_SECONDS` of training, at least one step, at most
    :data:`MAX_STEPS_BETWEEN_CHECKS`."""
    if step_s <= 0:
        return 1
    return max(1, min(MAX_STEPS_BETWEEN_CHECKS, int(BUDGET_CHECK_SECONDS / step_s)))


def daly_interval(cost_s: float, mtbf_s: float) -> float:
    """The training time between checkpoints that loses the least to checkpoints and failures,
    for a checkpoint that costs ``cost_s`` and a mean time between failures ``mtbf_s``: Daly's
    higher-order optimum (J. T. Daly, "A higher order estimate of the optimum checkpoint
    interval for restart dumps", FGCS 22, 2006), sqrt(2dM) [1 + sqrt(d/2M)/3 + (d/2M)/9] - d for
    d < 2M, else M; its first term is Young's (1974) sqrt(2dM)."""
    d, m = max(cost_s, 0.0), mtbf_s
    if d >= 2 * m:
        return m
    ratio = d / (2 * m)
    return math.sqrt(2 * d * m) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - d


@dataclass(frozen=True)
class CheckpointRule:
    """One ``--checkpoint-every``: ``steps`` (every that many steps), ``seconds`` (every that
    long) or ``auto_mtbf_s`` (Daly's interval for that mean time between failures); one of the three."""

    steps: int | None = None
    seconds: float | None = None
    auto_mtbf_s: float | None = None

    def __post_init__(self) -> None:
        given = [v for v in (self.steps, self.seconds, self.auto_mtbf_s) if v is not None]
        if len(given) != 1:
            raise ValueError("a checkpoint rule has exactly one of steps, seconds and auto_mtbf_s")

    @classmethod
    def of_config(cls, config: Any) -> CheckpointRule | None:
        """The rule of a run's configuration (a RunConfig); None where it writes no checkpoints."""
        if config.checkpoint_every_steps is not None:
            return cls(steps=int(config.checkpoint_every_steps))
        if config.checkpoint_auto_mtbf_s is not None:
            return cls(auto_mtbf_s=float(config.checkpoint_auto_mtbf_s))
        if config.checkpoint_every_s is not None:
            return cls(seconds=float(config.checkpoint_every_s))
        return None

    def interval_s(self, cost_s: float) -> float | None:
        """Seconds between the end of one checkpoint and the due time of the next (None: by steps)."""
        if self.auto_mtbf_s is not None:
            return daly_interval(cost_s, self.auto_mtbf_s)
        return self.seconds

    def seconds_per_step(self, cost_s: float, step_s: float) -> float:
        """What checkpoints of ``cost_s`` seconds add to a step of ``step_s`` seconds on average.

        By steps: the cost over the interval. By duration: a checkpoint is due ``T`` seconds after
        the last one ended and written at the first clock check after that (every
        :func:`steps_between_checks` steps), so ``T`` plus half a check on average passes between
        two; the steps in it share the cost."""
        if self.steps is not None:
            return cost_s / self.steps
        interval = self.interval_s(cost_s) or 0.0
        between = interval + steps_between_checks(step_s) * step_s / 2
        return cost_s * step_s / max(between, step_s)

    def argument(self) -> str:
        """The rule as ``--checkpoint-every`` spells it: ``500steps``, ``120s``, ``auto:7200s``."""
        if self.steps is not None:
            return f"{self.steps}steps"
        if self.auto_mtbf_s is not None:
            return f"auto:{self.auto_mtbf_s:g}s"
        return f"{self.seconds:g}s"

    def describe(self, cost_s: float) -> str:
        """``every 500 steps`` or ``every 2m`` or ``every 41.2s (auto: Daly's ...)`` in words."""
        if self.steps is not None:
            return f"every {self.steps} steps"
        if self.auto_mtbf_s is not None:
            return (f"every {daly_interval(cost_s, self.auto_mtbf_s):.3g}s (auto: Daly's optimum for an MTBF "
                    f"of {self.auto_mtbf_s:g}s)")
        return f"every {self.seconds:g}s"

"""Learning-rate schedules of the tasks (docs/tasks.md), as pure functions of the step.

Pure functions of (spec, workers, step) so that every worker computes the same rate without
communicating, a test can check the documented values at the documented epochs, and a single
process can replay the schedule of k workers when checking exactness.
"""

from __future__ import annotations

import math

from mlbench.tasks.spec import LRSchedule


def learning_rate(schedule: LRSchedule, *, workers: int, batch_per_worker: int, step: int,
                  steps_per_epoch: int) -> float:
    """The rate used for the update of ``step`` (0-based, counting every step of the run).

    warmup-multistep (task 1a): ``eta*b`` at step 0, rising linearly per step to ``eta*b*k`` at
    the end of ``warmup_epochs`` (Goyal et al. 2017, "gradual warm-up"), then constant and
    divided by ``decay_factor`` once at the start of each milestone epoch.

    inverse-sqrt (task 2a): ``alpha(k) / sqrt(t)`` with ``t = step + 1``.
    """
    if schedule.kind == "warmup-multistep":
        base = schedule.eta_per_sample * batch_per_worker
        peak = base * workers
        epoch_progress = step / steps_per_epoch
        if schedule.warmup_epochs > 0 and epoch_progress < schedule.warmup_epochs:
            rate = base + (peak - base) * epoch_progress / schedule.warmup_epochs
        else:
            rate = peak
        epoch = step // steps_per_epoch
        decays = sum(1 for m in schedule.milestones if epoch >= m)
        return rate / schedule.decay_factor ** decays
    if schedule.kind == "inverse-sqrt":
        return schedule.alpha(workers) / math.sqrt(step + 1)
    raise ValueError(f"unknown learning-rate schedule {schedule.kind!r}")

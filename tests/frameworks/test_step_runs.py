"""The runs of steps a port that holds its training set is called with (``step_runs``): each
ends where a log line is written, at the epoch's end and at ``max_steps``, so one call covers
a logging interval and what is logged stays as with one call per step."""

from __future__ import annotations

import pytest

from mlbench.worker.port_trainer import step_runs


@pytest.mark.parametrize(("first", "steps", "log_every", "max_steps", "runs"), [
    (0, 20, 7, None, [7, 7, 6]),      # log lines at 7, 14 and the epoch's end
    (0, 21, 7, None, [7, 7, 7]),
    (0, 5, 7, None, [5]),             # an epoch shorter than an interval: one run
    (40, 20, 7, 45, [5]),             # max_steps inside the epoch
    (40, 20, 7, 40, []),              # max_steps reached at the epoch's start
    (40, 20, 7, 30, []),
    (0, 20, 1, None, [1] * 20),
    (20, 20, 50, 1000, [20]),
])
def test_a_run_of_steps_ends_at_each_log_line_the_epochs_end_and_max_steps(first, steps, log_every, max_steps,
                                                                            runs):
    assert step_runs(first, steps, log_every, max_steps) == runs

"""Median, range and olympic mean over repeats; runs that missed the goal are never dropped."""

import math

import pytest

from mlbench.results.repeats import repeat_stats


def test_five_converged_repeats_give_median_range_and_olympic_mean():
    stats = repeat_stats([100.0, 130.0, 110.0, 90.0, 200.0])
    assert stats.runs == 5 and stats.converged == 5
    assert stats.median == 110.0
    assert (stats.minimum, stats.maximum) == (90.0, 200.0)
    # the fastest (90) and the slowest (200) are dropped
    assert stats.olympic_mean == pytest.approx((100 + 110 + 130) / 3)


def test_a_run_that_missed_the_goal_counts_as_the_slowest():
    stats = repeat_stats([50.0, None, 60.0])
    assert stats.runs == 3 and stats.converged == 2
    assert stats.median == 60.0 and stats.minimum == 50.0
    assert math.isinf(stats.maximum)
    # the olympic mean drops it as the worst run, but it still counts in the number of runs
    assert stats.olympic_mean == 60.0


def test_when_most_runs_missed_the_goal_the_result_is_not_converged():
    stats = repeat_stats([None, 40.0, None])
    assert stats.converged == 1
    assert math.isinf(stats.median) and math.isinf(stats.olympic_mean)


def test_with_fewer_than_three_runs_nothing_is_dropped():
    assert repeat_stats([10.0, 20.0]).olympic_mean == 15.0
    assert repeat_stats([10.0, 20.0]).median == 15.0
    assert math.isinf(repeat_stats([10.0, None]).olympic_mean)
    assert repeat_stats([7.0]).olympic_mean == 7.0

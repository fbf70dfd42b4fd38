"""The 95% interval, MLPerf's score, telling two families apart and the summary line of repeated runs."""

import math

import pytest

from mlbench.results.repeats import indistinguishable, repeat_stats, summary_text, t_quantile_975

SECONDS = lambda s: f"{s:.2f} s"

# t_{0.975, df} as printed in the usual tables (e.g. NIST/SEMATECH e-Handbook, 1.3.6.7.2), 3 decimals
PUBLISHED_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 10: 2.228, 20: 2.086, 30: 2.042,
                  40: 2.021, 60: 2.000, 100: 1.984}


@pytest.mark.parametrize("df", [*range(1, 31), 31, 40, 60, 100, 120, 999, 1000, 1001, 5000, 10**6])
def test_t_quantile_matches_scipy(df):
    stats = pytest.importorskip("scipy.stats")
    assert t_quantile_975(df) == pytest.approx(stats.t.ppf(0.975, df), rel=1e-8)


@pytest.mark.parametrize(("df", "published"), sorted(PUBLISHED_T975.items()))
def test_t_quantile_matches_the_published_table(df, published):
    assert round(t_quantile_975(df), 3) == published


def test_t_quantile_needs_a_degree_of_freedom():
    with pytest.raises(ValueError, match="at least 1 degree"):
        t_quantile_975(0)


def test_interval_of_five_runs_is_the_mean_plus_minus_t4_standard_errors():
    # mean 12, sample sd sqrt(10/4) = 1.5811, t(4) = 2.776445: 12 ± 2.776445 * 1.5811 / sqrt(5) = 12 ± 1.9630
    low, high = repeat_stats([14.0, 10.0, 12.0, 11.0, 13.0]).interval95
    assert low == pytest.approx(12 - 1.963243, abs=1e-6)
    assert high == pytest.approx(12 + 1.963243, abs=1e-6)


def test_interval_beyond_thirty_degrees_of_freedom_uses_t_not_the_normal():
    # 40 runs alternating 9 and 11: mean 10, sd sqrt(40/39), t(39) = 2.022691 (not z = 1.959964)
    low, high = repeat_stats([9.0, 11.0] * 20).interval95
    half = 2.022691 * math.sqrt(40 / 39) / math.sqrt(40)
    assert (low, high) == (pytest.approx(10 - half, abs=1e-6), pytest.approx(10 + half, abs=1e-6))


def test_no_interval_from_fewer_than_five_runs_or_with_a_run_that_missed():
    assert repeat_stats([10.0, 11.0, 12.0, 13.0]).interval95 is None
    assert repeat_stats([10.0, 11.0, 12.0, 13.0, None]).interval95 is None
    assert repeat_stats([]).interval95 is None


def test_mlperf_score_of_five_runs_drops_the_fastest_and_the_slowest():
    stats = repeat_stats([100.0, 130.0, 110.0, 90.0, 200.0])
    assert stats.mlperf_score == pytest.approx((100 + 110 + 130) / 3)
    assert stats.mlperf_note == "mean of 3 of 5 runs, the fastest and the slowest dropped (MLPerf Training)"


def test_mlperf_score_of_five_runs_drops_one_that_did_not_converge_as_the_slowest():
    stats = repeat_stats([100.0, None, 110.0, 90.0, 130.0])
    assert stats.mlperf_score == pytest.approx((100 + 110 + 130) / 3)
    assert stats.mlperf_note == ("mean of 3 of 5 runs, the fastest and the one that did not converge "
                                 "(as the slowest) dropped (MLPerf Training)")


def test_mlperf_score_of_seven_runs_averages_the_middle_five():
    assert repeat_stats([20.0, 25.0, 21.0, 30.0, 22.0, 24.0, 23.0]).mlperf_score == pytest.approx(23.0)
    # one missed: it is dropped as the slowest, the 28 stays
    assert repeat_stats([20.0, 25.0, 21.0, None, 22.0, 24.0, 28.0]).mlperf_score == pytest.approx(24.0)


@pytest.mark.parametrize("values", [[100.0, None, 110.0, None, 130.0],
                                    [20.0, 25.0, None, 30.0, 22.0, None, 23.0],
                                    [100.0, None, None]])
def test_two_runs_that_did_not_converge_give_no_mlperf_score_however_many_runs_follow(values):
    stats = repeat_stats(values)
    assert stats.mlperf_score is None
    assert stats.mlperf_note == (f"2 of {len(values)} runs did not converge: MLPerf allows at most one, "
                                 "so no number of further runs gives a score")


def test_fewer_than_five_runs_give_no_mlperf_score_and_say_how_many_more():
    four, three, one = repeat_stats([1.0, 2.0, 3.0, 4.0]), repeat_stats([1.0, 2.0, None]), repeat_stats([1.0])
    assert four.mlperf_score is None and three.mlperf_score is None and one.mlperf_score is None
    assert four.mlperf_note == "4 runs: MLPerf scores at least 5, 1 more run needed"
    assert three.mlperf_note == "3 runs: MLPerf scores at least 5, 2 more runs needed"
    assert one.mlperf_note == "1 run: MLPerf scores at least 5, 4 more runs needed"
    # the olympic mean of 3 runs is still there: MLPerf's rule is the stricter one
    assert three.olympic_mean == 2.0


def test_separate_ranges_are_distinguishable():
    a, b = repeat_stats([10.0, 11.0, 12.0]), repeat_stats([13.0, 14.0, 15.0])
    assert not indistinguishable(a, b) and not indistinguishable(b, a)


def test_overlapping_ranges_are_indistinguishable():
    a, b = repeat_stats([10.0, 12.0, 14.0]), repeat_stats([11.0, 13.0, 15.0])
    assert indistinguishable(a, b) and indistinguishable(b, a)


def test_touching_ranges_share_a_value_and_are_indistinguishable():
    a, b = repeat_stats([10.0, 11.0, 12.0]), repeat_stats([12.0, 13.0, 14.0])
    assert indistinguishable(a, b) and indistinguishable(b, a)


def test_a_run_that_missed_opens_the_range_upwards():
    faster, slower = repeat_stats([10.0, 11.0, None]), repeat_stats([13.0, 14.0, 15.0])
    assert indistinguishable(faster, slower)
    # the open end reaches only upwards: a family entirely below the other's fastest run stays apart
    assert not indistinguishable(repeat_stats([10.0, 11.0, 12.0]), repeat_stats([13.0, None]))


def test_a_family_that_never_converged_is_apart_only_from_one_that_always_did():
    never = repeat_stats([None, None, None])
    assert not indistinguishable(never, repeat_stats([10.0, 11.0, 12.0]))
    assert indistinguishable(never, repeat_stats([10.0, 11.0, None]))
    assert indistinguishable(never, repeat_stats([None]))


def test_a_family_without_runs_tells_nothing_apart():
    assert indistinguishable(repeat_stats([]), repeat_stats([10.0, 11.0]))


def test_summary_of_five_converged_runs_has_median_range_and_interval():
    stats = repeat_stats([14.0, 10.0, 12.0, 11.0, 13.0])
    assert summary_text(stats, SECONDS) == "n=5, median 12.00 s (10.00 s..14.00 s, 95% CI 10.04 s..13.96 s)"
    assert summary_text(stats, lambda s: f"{s:.1f}") == "n=5, median 12.0 (10.0..14.0, 95% CI 10.0..14.0)"


def test_summary_without_interval_names_the_converged_count_and_the_misses():
    assert summary_text(repeat_stats([50.0, None, 60.0]), SECONDS) == \
        "n=3 (2 converged), median 60.00 s (50.00 s..not converged)"
    assert summary_text(repeat_stats([None, 40.0, None]), SECONDS) == \
        "n=3 (1 converged), median not converged (40.00 s..not converged)"
    assert summary_text(repeat_stats([1.0, 2.0, 3.0, 4.0]), SECONDS) == "n=4, median 2.50 s (1.00 s..4.00 s)"


def test_summary_of_no_runs():
    assert summary_text(repeat_stats([]), SECONDS) == "n=0, no runs"

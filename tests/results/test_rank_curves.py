"""A metric's curve per rank or over all ranks (the run page's per-worker chart and its System
chart, mlbench/results/rank_curves.py): each rank on its own clock, the mean at each step, and
long runs thinned so that an answer stays small."""

from __future__ import annotations

from mlbench.results.rank_curves import MAX_POINTS, rank_curves, thinned


def _interval(rank: int, step: int, seconds: float, loss: float) -> list[dict]:
    """One rank's logging interval as a worker writes it: its loss, then its training time."""
    at = {"time": 1e9 + seconds, "rank": rank, "epoch": step / 100, "step": step}
    return [{**at, "name": "train/loss", "value": loss}, {**at, "name": "train/time", "value": seconds},
            {**at, "name": "sys/rss_bytes", "value": 1000 * (rank + 1)}]


def _two_ranks(intervals: int) -> list[dict]:
    events = []
    for k in range(1, intervals + 1):
        events += _interval(0, 10 * k, 1.0 * k, 1.0 / k) + _interval(1, 10 * k, 1.5 * k, 3.0 / k)
    return events + [{"time": 1e9, "rank": 0, "epoch": 0.1, "step": 10, "name": "eval/accuracy", "value": 0.5}]


def test_each_rank_has_its_own_line_at_its_own_training_time():
    curves = rank_curves(_two_ranks(3), ["train/loss"], each=True)
    assert [(line["rank"], line["label"]) for line in curves["lines"]] == [(0, "rank 0"), (1, "rank 1")]
    assert curves["lines"][0]["points"] == [[1.0, 1.0], [2.0, 0.5], [3.0, 1 / 3]]
    assert curves["lines"][1]["points"] == [[1.5, 3.0], [3.0, 1.5], [4.5, 1.0]]


def test_all_ranks_is_the_mean_of_their_values_at_each_step():
    (line,) = rank_curves(_two_ranks(2), ["train/loss"], each=False)["lines"]
    assert (line["rank"], line["label"]) == (None, "all ranks")
    assert line["points"] == [[1.25, 2.0], [2.5, 1.0]]


def test_the_run_names_its_per_rank_metrics_and_an_unknown_one_has_no_line():
    curves = rank_curves(_two_ranks(1), ["sys/rss_bytes", "no/such"], each=True)
    assert curves["metrics"] == ["sys/rss_bytes", "train/loss", "train/time"]  # eval/ is rank 0's alone
    assert [(line["metric"], line["points"]) for line in curves["lines"]] == [
        ("sys/rss_bytes", [[1.0, 1000.0]]), ("sys/rss_bytes", [[1.5, 2000.0]])]


def test_a_long_run_is_thinned_to_at_most_the_limit_with_its_last_point():
    lines = rank_curves(_two_ranks(3 * MAX_POINTS + 7), ["train/loss"], each=True)["lines"]
    for line in lines:
        assert 2 <= len(line["points"]) <= MAX_POINTS
        assert line["points"][-1][0] == (3 * MAX_POINTS + 7) * (1.0 if line["rank"] == 0 else 1.5)
    points = [(k, float(k), float(k)) for k in range(10)]
    assert thinned(points, 10) == points and len(thinned(points, 4)) <= 4 and thinned(points, 4)[-1] == points[-1]


def test_more_metrics_come_one_line_per_rank_under_each_from_the_same_reading():
    curves = rank_curves(_two_ranks(1), ["train/loss"], each=False, each_names=["sys/rss_bytes"])
    assert [line["label"] for line in curves["lines"]] == ["all ranks"]
    assert [(line["metric"], line["rank"], line["points"]) for line in curves["each"]] == [
        ("sys/rss_bytes", 0, [[1.0, 1000.0]]), ("sys/rss_bytes", 1, [[1.5, 2000.0]])]
    assert "each" not in rank_curves(_two_ranks(1), ["train/loss"], each=False)

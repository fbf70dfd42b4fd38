"""The time a link-down made every rank wait (issue 24: stragglers are reported, not hidden).

A rank whose emulated link is down blocks every collective, its own too: no rank leads the others,
so the straggler figures (one rank's busy time beyond the median) cannot show it. What it cost is
measured from the logging intervals that overlap the outage (tests/network holds a real one to it).
"""

from __future__ import annotations

import pytest

from mlbench.results.goodput import describe_faults, link_down_blocked

T0 = 1_000_000.0


def intervals(rank: int, blocked_in_third: float, steps: int = 10, per_step: float = 0.01,
              evaluation: float | None = None, blocked_in_evaluation: float = 0.0) -> list[dict]:
    """Five logging intervals of one rank, one a second from T0 + 1 on; the third (T0 + 2 to
    T0 + 3) holds the outage's wait, in its collectives of training and (``blocked_in_evaluation``)
    of an evaluation; with ``evaluation``, every interval evaluates in that many seconds."""
    events = []
    for i in range(5):
        comm = steps * per_step + (blocked_in_third if i == 2 else 0.0)
        values = [("time/communication", comm), ("train/steps", steps)]
        if evaluation is not None:
            values.append(("time/eval", evaluation + (blocked_in_evaluation if i == 2 else 0.0)))
        for name, value in values:
            events.append({"name": name, "rank": rank, "step": (i + 1) * steps, "time": T0 + 1 + i, "value": value})
    return events


def link_down(at: float, down_s: float, rank: int = 1, **extra) -> dict:
    return {"kind": "link-down", "rank": rank, "at": at, "time": T0 + at, "down_s": down_s, "for": down_s, **extra}


def test_the_wait_of_every_rank_in_the_intervals_of_the_outage_is_the_blocked_time():
    events = intervals(0, 2.6) + intervals(1, 2.4)
    measured = link_down_blocked([link_down(2.2, 0.5)], events)
    # beyond the link's 0.5 s down: TCP's retransmission comes after its backed-off timeout
    assert measured == {"down_s": 0.5, "blocked_s": pytest.approx(2.5), "ranks": [1]}


def test_a_wait_in_an_evaluations_collective_counts_beyond_the_usual_evaluation():
    # the outage came while the ranks evaluated: the all-reduce of the metrics waited 3 s
    events = intervals(0, 0.0, evaluation=0.02, blocked_in_evaluation=3.1) + \
        intervals(1, 0.0, evaluation=0.02, blocked_in_evaluation=3.0)
    measured = link_down_blocked([link_down(2.2, 2.0)], events)
    assert measured == {"down_s": 2.0, "blocked_s": pytest.approx(3.05), "ranks": [1]}
    # an interval that evaluated as usual adds nothing
    usual = intervals(0, 2.6, evaluation=0.02) + intervals(1, 2.4, evaluation=0.02)
    assert link_down_blocked([link_down(2.2, 0.5)], usual)["blocked_s"] == pytest.approx(2.5)


def test_no_figure_without_an_applied_outage_or_an_interval_that_overlaps_it():
    events = intervals(0, 0.0) + intervals(1, 0.0)
    assert link_down_blocked([], events) is None
    assert link_down_blocked([link_down(2.2, 0.5, missed="the emulated network was not running")], events) is None
    assert link_down_blocked([{**link_down(2.2, 0.5), "down_s": None}], events) is None   # still down
    assert link_down_blocked([link_down(60.0, 1.0)], events) is None                     # after the last record
    assert link_down_blocked([link_down(2.2, 0.5)], []) is None


def test_status_says_what_the_link_down_cost_every_rank():
    faults = {"injected": ["link-down:rank=1,at=2s,for=0.5s"], "on_failure": "fail",
              "events": [link_down(2.2, 0.5)], "count": 1, "restarts": 0, "lost_steps": 0, "detect_s": [],
              "recover_s": [], "goodput": None, "stragglers": None,
              "link_down": {"down_s": 0.5, "blocked_s": 2.5, "ranks": [1]}}
    rows = dict(describe_faults(faults))
    assert rows["link down"] == "every rank waited 2.50 s in its collectives for the link of rank 1 (down 0.50 s)"
    assert "link down" not in dict(describe_faults({**faults, "link_down": None}))

"""Injected faults: when each one of a run's ``--inject`` schedules strikes.

A schedule (one ``--inject KIND:rank=R,...`` as :mod:`mlbench.launch.faults` parsed it and
run.json records it, under ``config.faults``) is a plain dict::

    {"text": "kill:rank=1,every=90s", "kind": "kill", "rank": 1, "at": None, "every": 90.0,
     "every_range": None, "for": None, "factor": None, "seed": 0}

Its times are seconds on the run's *fault clock*, which starts when the supervisor first starts
the workers and goes on through restarts (a restart does not move the schedule). The times
follow from the dict alone, a random interval (``every=rand(60s,120s),seed=3``) from its own
seeded generator, so that the same schedule strikes at the same moments in every run and under
every recovery policy. Only :func:`start_times` and :func:`slow_factor` decide; the supervisor
(:mod:`mlbench.launch.injector`) applies kills and stalls, the worker
(:mod:`mlbench.worker.straggler`) its own slowdown. No torch here: status reads it too.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import Any

KILL, STALL, SLOW, LINK_DOWN = "kill", "stall", "slow", "link-down"
KINDS = (KILL, STALL, SLOW, LINK_DOWN)
#: The environment variable that hands the fault clock's start (unix seconds) to the workers.
FAULT_CLOCK_ENV = "MLBENCH_FAULT_CLOCK"

Schedule = Mapping[str, Any]


def policy_text(policy: str, limit: int) -> str:
    """An ``--on-failure`` policy as a user types it: ``restart:3``, ``shrink``, ``shrink:2``,
    ``fail`` (``limit`` 0: none but the policy's own)."""
    return f"{policy}:{limit}" if limit and policy != "fail" else policy


def worker_sizes(started: int, restarts: Iterable[Mapping[str, Any]]) -> list[int]:
    """The sizes a run's group trained at, in order: ``started``, then each shrink's new size
    (``faults.restarts`` entries with ``workers``; a restart at the same size adds none)."""
    sizes = [started]
    for entry in restarts:
        size = entry.get("workers")
        if isinstance(size, int) and size != sizes[-1]:
            sizes.append(size)
    return sizes


def workers_label(sizes: list[int]) -> str:
    """``4``, or ``4 -> 3`` for a run that shrank (what every surface showing workers shows)."""
    return " -> ".join(str(size) for size in sizes)


def periodic(spec: Schedule) -> bool:
    return spec.get("every") is not None or spec.get("every_range") is not None


def start_times(spec: Schedule, until: float) -> list[float]:
    """The moments (fault-clock seconds, ascending) at which ``spec`` strikes up to ``until``.

    ``at=T`` alone: once at T; ``every=E``: at E, 2E, ... (from ``at`` when both are given);
    ``every=rand(A,B),seed=S``: intervals drawn uniformly in [A, B] by a generator seeded with S;
    neither (a straggler from the start): once at 0."""
    rng = random.Random(int(spec.get("seed") or 0))

    def interval() -> float:
        bounds = spec.get("every_range")
        return rng.uniform(float(bounds[0]), float(bounds[1])) if bounds else float(spec["every"])

    if spec.get("at") is not None:
        moment = float(spec["at"])
    else:
        moment = interval() if periodic(spec) else 0.0
    times = []
    while moment <= until:
        times.append(moment)
        if not periodic(spec):
            break
        moment += interval()
    return times


def slow_factor(specs: Iterable[Schedule], rank: int, now: float) -> float:
    """How many times slower rank ``rank`` computes at fault-clock second ``now`` (1: not
    slowed): the largest factor of its ``slow`` schedules whose window (from a start time, for
    ``for`` seconds or for ever) holds ``now``."""
    factor = 1.0
    for spec in specs:
        if spec.get("kind") != SLOW or spec.get("rank") != rank:
            continue
        length = spec.get("for")
        for begin in start_times(spec, now):
            if length is None or now < begin + float(length):
                factor = max(factor, float(spec.get("factor") or 1.0))
    return factor


def describe_fault(event: Mapping[str, Any]) -> str:
    """One applied fault in words: ``kill of rank 1 at 3.0 s``."""
    return f"{event.get('kind')} of rank {event.get('rank')} at {float(event.get('at') or 0.0):.1f} s"

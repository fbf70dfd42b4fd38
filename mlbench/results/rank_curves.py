"""A metric's curve per rank, or over all ranks, against training time: the run page's per-rank
lines and its System chart (docs/dashboard.md).

Every rank records its own numbers each logging interval (training loss, phase seconds, bytes
sent, the ``sys/`` metrics of docs/system-metrics.md). A point's x is the training time its rank
recorded at the same step (``train/time``, the interval's first at that step), so each rank's
line runs on its own clock. "All ranks" is the mean over the ranks of their values at a step, at
the ranks' mean training time then. Long runs are thinned to at most ``max_points`` points a
line (every k-th, the last kept), so that an answer stays small whatever the run's length.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from mlbench.results.events import NUMERIC_PREFIXES

#: The most points of one line a page is sent.
MAX_POINTS = 500
#: The per-rank metrics of an interval: what every rank records (the evaluations are rank 0's).
RANK_PREFIXES = tuple(p for p in NUMERIC_PREFIXES if p != "eval/")

Point = tuple[int, float, float]  # step, training seconds, value


def rank_metrics(events: list[dict[str, Any]]) -> list[str]:
    """The names of the run's per-rank metrics, sorted."""
    return sorted({e["name"] for e in events if e["name"].startswith(RANK_PREFIXES)})


def _per_rank(events: list[dict[str, Any]], name: str) -> dict[int, list[Point]]:
    clock: dict[tuple[int, int], float] = {}
    for e in events:
        if e["name"] == "train/time":
            clock.setdefault((int(e["rank"]), int(e["step"])), float(e["value"]))
    lines: dict[int, list[Point]] = defaultdict(list)
    for e in events:
        if e["name"] != name or not math.isfinite(e["value"]):
            continue
        rank, step = int(e["rank"]), int(e["step"])
        at = clock.get((rank, step))
        if at is not None:
            lines[rank].append((step, at, float(e["value"])))
    return {rank: lines[rank] for rank in sorted(lines)}


def _mean(lines: dict[int, list[Point]]) -> list[Point]:
    by_step: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for points in lines.values():
        for step, at, value in points:
            by_step[step].append((at, value))
    return [(step, sum(a for a, _ in pairs) / len(pairs), sum(v for _, v in pairs) / len(pairs))
            for step, pairs in sorted(by_step.items())]


def thinned(points: list[Point], max_points: int = MAX_POINTS) -> list[Point]:
    """Every k-th point, so that at most ``max_points`` are left, and the last one."""
    if len(points) <= max_points:
        return points
    stride = math.ceil(len(points) / max(1, max_points - 1))
    return points[::stride] + ([points[-1]] if (len(points) - 1) % stride else [])


def rank_curves(events: list[dict[str, Any]], names: list[str], each: bool,
                max_points: int = MAX_POINTS, each_names: list[str] | None = None) -> dict[str, Any]:
    """The lines of the metrics ``names``: one per rank (``each``), else one over all ranks;
    each with its metric, rank (None: all), label and [training seconds, value] points; and
    the names of every per-rank metric the run has. ``each_names``: more metrics, one line per
    rank whatever ``each`` says, under ``"each"`` (the run page's System chart, drawn from the
    same reading of the events)."""
    def lines_of(metrics: list[str], per_rank: bool) -> list[dict[str, Any]]:
        lines = []
        for name in metrics:
            ranks = _per_rank(events, name)
            parts = [(rank, f"rank {rank}", points) for rank, points in ranks.items()] if per_rank else \
                ([(None, "all ranks", _mean(ranks))] if ranks else [])
            lines += [{"metric": name, "rank": rank, "label": label,
                       "points": [[at, value] for _, at, value in thinned(points, max_points)]}
                      for rank, label, points in parts]
        return lines

    answer = {"metrics": rank_metrics(events), "lines": lines_of(names, each)}
    if each_names:
        answer["each"] = lines_of(each_names, True)
    return answer

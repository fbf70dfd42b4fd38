"""The goal metrics of the tasks: their names, their direction and how they are shown.

Time to accuracy asks when a metric first reaches the task's goal; "reaches" depends on the
metric: test accuracy and BLEU rise to their goals, perplexity falls to its goal
(docs/tasks.md). Everything that judges or shows a goal (the worker's goal check, status,
compare, charts, the MLLOG export) goes through a :class:`Metric`, never through ``>=``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """A task's goal metric: ``name`` as recorded (``eval/<name>`` events), its direction, and
    whether it is a fraction shown as a percentage."""

    name: str
    title: str
    higher_is_better: bool
    percent: bool = False
    #: The values a goal may take: above ``low`` (exclusive) and at most ``high``.
    low: float = float("-inf")
    high: float = float("inf")

    def check_goal(self, goal: float) -> str | None:
        """Why ``goal`` cannot be a goal of this metric (None: it can)."""
        if goal <= self.low or goal > self.high:
            if self.percent:
                return f"a {self.title} goal is a fraction above {self.low:g} and at most {self.high:g} (0.8 = 80%)"
            return f"a {self.title} goal is above {self.low:g}" + (
                f" and at most {self.high:g}" if self.high != float("inf") else "")
        return None

    def reached(self, value: float | None, goal: float | None) -> bool:
        """Whether ``value`` meets ``goal`` (never without both)."""
        if value is None or goal is None:
            return False
        return value >= goal if self.higher_is_better else value <= goal

    def best(self, values: list[float]) -> float | None:
        """The best of ``values`` in this metric's direction."""
        if not values:
            return None
        return max(values) if self.higher_is_better else min(values)

    def format(self, value: float | None) -> str:
        """'80.00%' for a fraction, '70.3' for a perplexity or a BLEU score, '-' for none."""
        if value is None:
            return "-"
        return f"{100 * value:.2f}%" if self.percent else f"{value:.2f}"

    def describe_goal(self, goal: float) -> str:
        """'80.00% test accuracy', 'validation perplexity 70.00', 'BLEU 25.00'."""
        if self.percent:
            return f"{self.format(goal)} {self.title}"
        return f"{self.title} {self.format(goal)}"


METRICS: dict[str, Metric] = {}


def register_metric(metric: Metric) -> Metric:
    METRICS[metric.name] = metric
    return metric


ACCURACY = register_metric(Metric("accuracy", "test accuracy", higher_is_better=True, percent=True,
                                  low=0.0, high=1.0))
PERPLEXITY = register_metric(Metric("perplexity", "validation perplexity", higher_is_better=False, low=1.0))
BLEU = register_metric(Metric("bleu", "BLEU", higher_is_better=True, low=0.0, high=100.0))


def get_metric(name: str) -> Metric:
    """The metric called ``name``; unknown names (a record from a newer mlbench) read as
    accuracy-like: higher is better, shown as is."""
    return METRICS.get(name) or Metric(name, name, higher_is_better=True)

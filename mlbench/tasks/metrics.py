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


ACCURACY = register_metric(Metric("accuracy", "test accuracy", higher_is_better=True, percent=True))
PERPLEXITY = register_metric(Metric("perplexity", "validation perplexity", higher_is_better=False))
BLEU = register_metric(Metric("bleu", "BLEU", higher_is_better=True))


def get_metric(name: str) -> Metric:
    """The metric called ``name``; unknown names (a record from a newer mlbench) read as
    accuracy-like: higher is better, shown as is."""
    return METRICS.get(name) or Metric(name, name, higher_is_better=True)

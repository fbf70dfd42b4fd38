"""The goal metrics of the tasks: their names, units, direction and how they are shown.

Time to accuracy asks when a metric first reaches the task's goal; "reaches" depends on the
metric: test accuracy and BLEU rise to their goals, perplexity falls to its goal
(docs/tasks.md). Task 0a has no goal but a headline all the same: its bus bandwidth (GB/s,
higher is better) and its small-message latency (us, lower is better). Everything that judges
or shows a metric (the worker's goal check, the result sentence, status, compare, charts, the
dashboard, the MLLOG export) goes through a :class:`Metric`, never through ``>=`` or its own
format string, so that a perplexity is never shown as a percentage.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """A task's goal metric: ``name`` as recorded (``eval/<name>`` events), its direction, and
    whether it is a fraction shown as a percentage (else a number in ``unit``, if it has one)."""

    name: str
    title: str
    higher_is_better: bool
    percent: bool = False
    #: What a value is counted in ('%' for a fraction; '' for a pure number: perplexity, BLEU).
    unit: str = ""
    #: The short name before a value in a table cell ('ppl' 915.69, 'BLEU' 21.30); '' for none.
    symbol: str = ""
    #: Digits when shown: after the point (``style`` "f"), or significant ones ("g": bandwidths
    #: from 0.00385 to 12.4 GB/s).
    digits: int = 2
    style: str = "f"
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
        """'80.00%' for a fraction, '70.30' for a perplexity or a BLEU score, '12.40 GB/s' for a
        bandwidth, '-' for none."""
        if value is None:
            return "-"
        if self.percent:
            return f"{100 * value:.{self.digits}f}%"
        return f"{value:.{self.digits}{self.style}}" + (f" {self.unit}" if self.unit else "")

    def cell(self, value: float | None) -> str:
        """A value in a table of runs of different tasks: '81.20%', 'ppl 915.69', 'BLEU 21.30',
        '12.40 GB/s' (the symbol says what a bare number is)."""
        if value is None:
            return "-"
        return f"{self.symbol} {self.format(value)}" if self.symbol else self.format(value)

    def display(self, value: float) -> float:
        """The number a chart plots: percent for a fraction, the value itself otherwise."""
        return 100 * value if self.percent else value

    @property
    def axis_label(self) -> str:
        """A chart axis of this metric: 'test accuracy (%)', 'validation perplexity (lower is
        better)', 'bus bandwidth (GB/s)'."""
        unit = "%" if self.percent else self.unit
        direction = "" if self.higher_is_better else ", lower is better"
        inside = ", ".join(x for x in (unit, direction.removeprefix(", ")) if x)
        return f"{self.title} ({inside})" if inside else self.title

    def describe_goal(self, goal: float) -> str:
        """The goal with its metric and direction: 'test accuracy >= 80.00%', 'validation
        perplexity <= 70.00', 'validation loss <= 3.2800', 'BLEU >= 25.00'."""
        return f"{self.title} {'>=' if self.higher_is_better else '<='} {self.format(goal)}"

    def describe(self) -> dict[str, object]:
        """The metric as data (`-o json`, the dashboard): name, title, unit (``fraction``: a
        value from 0 to 1 shown as a percentage), direction."""
        return {"name": self.name, "title": self.title, "unit": "fraction" if self.percent else self.unit,
                "higher_is_better": self.higher_is_better, "axis": self.axis_label}


METRICS: dict[str, Metric] = {}


def register_metric(metric: Metric) -> Metric:
    METRICS[metric.name] = metric
    return metric


ACCURACY = register_metric(Metric("accuracy", "test accuracy", higher_is_better=True, percent=True,
                                  low=0.0, high=1.0))
PERPLEXITY = register_metric(Metric("perplexity", "validation perplexity", higher_is_better=False, low=1.0,
                                    symbol="ppl"))
BLEU = register_metric(Metric("bleu", "BLEU", higher_is_better=True, low=0.0, high=100.0, symbol="BLEU"))
#: Task 5a's: the mean cross-entropy (nats per token) of the validation tokens, as the GPT-2
#: speedrun and llm.c report it (3.28 is their goal).
VALIDATION_LOSS = register_metric(Metric("val_loss", "validation loss", higher_is_better=False, low=0.0,
                                         symbol="loss", digits=4))
#: Task 0a's headline: the peak of nccl-tests' bus bandwidth over the sweep (task spec's name).
BUS_BANDWIDTH = register_metric(Metric("bus bandwidth", "bus bandwidth", higher_is_better=True,
                                       unit="GB/s", digits=3, style="g"))
#: Task 0a on one worker, where nothing travels and the bus bandwidth is 0: the peak rate of
#: the operation itself.
ALGORITHM_BANDWIDTH = register_metric(Metric("algorithm bandwidth", "algorithm bandwidth",
                                             higher_is_better=True, unit="GB/s", digits=3, style="g"))
#: Task 0a's other figure: the time of one all-reduce of the smallest message, in microseconds.
LATENCY = register_metric(Metric("latency", "small-message latency", higher_is_better=False,
                                 unit="us", digits=1))


def get_metric(name: str) -> Metric:
    """The metric called ``name``; unknown names (a record from a newer mlbench) read as
    accuracy-like: higher is better, shown as is."""
    return METRICS.get(name) or Metric(name, name, higher_is_better=True)

"""The result of a run, as rank 0 records it and everything else reads it.

Rank 0 writes it as the ``result`` event and the launcher copies it into the run catalog; status,
compare, charts, download, the dashboard and the MLLOG export read it through
:func:`read_result`, never by dictionary key. Two kinds share one interface (``goal_metric``,
``headline``, ``sentence()``, ``goal``, ``reached``): a training run's :class:`TrainingResult`
and task 0a's all-reduce sweep, :class:`AllreduceResult`. In a training result
``final_accuracy`` and ``best_accuracy`` hold the task's *goal metric*, whatever it is
(``metric``: test accuracy, validation perplexity, BLEU); the names are those of the record
format, which outlives this class.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from mlbench.tasks.task0a.sweep import peak
from mlbench.tasks.metrics import ALGORITHM_BANDWIDTH, BUS_BANDWIDTH, LATENCY, Metric, get_metric


def fmt_duration(seconds: float | None) -> str:
    """'0:05:00' for 300 s, '1.2s' under a minute, '-' for none."""
    if seconds is None:
        return "-"
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{sec:02d}"


@dataclass
class TrainingResult:
    """How a training run ended: the goal, whether and when it was reached, the final metrics."""

    goal: float | None = None
    light: bool = False
    reached: bool = False
    metric: str = "accuracy"
    time_to_accuracy: float | None = None
    wall_time_to_accuracy: float | None = None
    epochs_to_accuracy: float | None = None
    steps_to_accuracy: int | None = None
    final_accuracy: float | None = None
    final_loss: float | None = None
    best_accuracy: float | None = None
    train_time: float = 0.0
    eval_time: float = 0.0
    epochs: float = 0.0
    steps: int = 0
    stop_reason: str = ""
    bytes_sent: int = 0
    train_samples: int | None = None
    test_samples: int | None = None
    #: the machine's 1, 5 and 15 minute load averages as the run ended (rank 0's, recorded by
    #: the worker: mlbench.results.environment.load_average); None for an older run
    load_average_end: list[float] | None = None
    #: the tasks the kernel had runnable as the run ended (mlbench.results.environment.runnable_tasks)
    runnable_end: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> TrainingResult | None:
        """The result recorded as ``data``; None for no result or another kind (task 0a's)."""
        if not data or data.get("kind", "training") != "training":
            return None
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def goal_metric(self) -> Metric:
        return get_metric(self.metric)

    @property
    def headline(self) -> float | None:
        """The value of :attr:`goal_metric` a table shows for the run: the final one."""
        return self.final_accuracy

    def sentence(self) -> str:
        """The one-line result of `mlbench run`, `status` and the dashboard."""
        m = self.goal_metric
        if self.goal is None:
            return (f"Finished ({self.stop_reason}): {self.steps} steps, {self.epochs:.2f} epochs in "
                    f"{fmt_duration(self.train_time)} of training.")
        if self.reached:
            return (f"Goal {m.describe_goal(self.goal)} reached: time to goal "
                    f"{fmt_duration(self.time_to_accuracy)} (epoch {self.epochs_to_accuracy or 0:.2f}, "
                    f"evaluation excluded; {fmt_duration(self.wall_time_to_accuracy)} with it); "
                    f"final {m.title.removeprefix('test ')} {m.format(self.final_accuracy)}.")
        return (f"Goal {m.describe_goal(self.goal)} not reached ({self.stop_reason}): "
                f"{m.format(self.final_accuracy)} after {fmt_duration(self.train_time)} of training "
                f"(best {m.format(self.best_accuracy)}, {self.epochs:.2f} epochs).")


@dataclass
class AllreduceResult:
    """Task 0a's sweep: one row per dtype and message size (nccl-tests' figures, see
    :mod:`mlbench.tasks.task0a.sweep`), headlined by the peak bus bandwidth.

    On one worker nothing travels and the bus bandwidth is 0 by definition, so the headline is
    the peak algorithm bandwidth there. Goal fields are those of a run without a goal, so code
    that reads any result (compare's families, the MLLOG's status) needs no case for it.
    """

    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    workers: int = 1
    backend: str = ""
    device: str = ""
    wrong: int = 0
    steps: int = 0
    train_time: float = 0.0
    stop_reason: str = ""
    goal: None = None
    reached: bool = False
    time_to_accuracy: None = None
    wall_time_to_accuracy: None = None
    epochs: None = None
    test_samples: None = None
    train_samples: None = None
    load_average_end: list[float] | None = None   # as TrainingResult's
    runnable_end: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> AllreduceResult | None:
        """The sweep recorded as ``data``; None for no result or another kind."""
        if not data or data.get("kind") != "allreduce":
            return None
        known = {f.name for f in dataclasses.fields(cls)} - {"goal", "reached", "time_to_accuracy",
                                                             "wall_time_to_accuracy", "epochs"}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def goal_metric(self) -> Metric:
        return BUS_BANDWIDTH if self.workers > 1 else ALGORITHM_BANDWIDTH

    @property
    def peak_row(self) -> dict[str, Any] | None:
        return peak(self.rows)

    @property
    def headline(self) -> float | None:
        """The peak bus bandwidth in GB/s (algorithm bandwidth on one worker)."""
        best = self.peak_row
        if best is None:
            return None
        return float(best["busbw_gbps"] if self.workers > 1 else best["algbw_gbps"])

    @property
    def latency_us(self) -> float | None:
        """Microseconds per all-reduce of the smallest message in the sweep's first dtype (fp32
        unless the sweep was restricted): nccl-tests' small-message time, where the latency of
        the backend and the network, not the bandwidth, sets the pace."""
        if not self.rows:
            return None
        first = [r for r in self.rows if r["dtype"] == self.rows[0]["dtype"]]
        return 1e6 * float(min(first, key=lambda r: r["elements"])["time_s"])

    def bandwidth(self, row: dict[str, Any]) -> float:
        """The headline figure of one row (bus bandwidth; algorithm bandwidth on one worker)."""
        return float(row["busbw_gbps"] if self.workers > 1 else row["algbw_gbps"])

    def sentence(self) -> str:
        """The one-line result of `mlbench run`, `status` and the dashboard."""
        best = self.peak_row
        if best is None:
            return "No measurements."
        wrong = f" {self.wrong} wrong elements!" if self.wrong else ""
        metric = self.goal_metric
        where = (f"{best['dtype']}, {best['elements']} elements, {self.workers} workers, {self.backend}"
                 if self.workers > 1 else f"{best['dtype']}, {best['elements']} elements")
        lead = "One worker: nothing travels; peak " if self.workers == 1 else "Peak "
        return (f"{lead}{metric.title} {metric.format(self.headline)} ({where}); "
                f"{LATENCY.title} {LATENCY.format(self.latency_us)}.{wrong}")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "allreduce", **dataclasses.asdict(self)}


Outcome = TrainingResult | AllreduceResult


def read_result(data: dict[str, Any] | None) -> Outcome | None:
    """The recorded result ``data`` as the class of its kind; None for none (or an unknown kind)."""
    return TrainingResult.from_dict(data) or AllreduceResult.from_dict(data)

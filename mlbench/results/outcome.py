"""The result of a training run, as rank 0 records it and everything else reads it.

Rank 0 writes it as the ``result`` event and the launcher copies it into the run catalog; status,
compare, charts, download and the MLLOG export read it through :class:`TrainingResult`, never by
dictionary key. ``final_accuracy`` and ``best_accuracy`` hold the task's *goal metric*, whatever
it is (``metric``: test accuracy, validation perplexity, BLEU); the names are those of the record
format, which outlives this class.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from mlbench.tasks.metrics import Metric, get_metric


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

    def sentence(self) -> str:
        """The one-line result of `mlbench run`, `status` and the dashboard."""
        m = self.goal_metric
        if self.goal is None:
            return (f"Finished ({self.stop_reason}): {self.steps} steps, {self.epochs:.2f} epochs in "
                    f"{fmt_duration(self.train_time)} of training.")
        if self.reached:
            return (f"Goal {m.format(self.goal)} reached: time to accuracy "
                    f"{fmt_duration(self.time_to_accuracy)} (epoch {self.epochs_to_accuracy or 0:.2f}, "
                    f"evaluation excluded; {fmt_duration(self.wall_time_to_accuracy)} with it); "
                    f"final {m.title.removeprefix('test ')} {m.format(self.final_accuracy)}.")
        return (f"Goal {m.format(self.goal)} not reached ({self.stop_reason}): "
                f"{m.title.removeprefix('test ')} after {fmt_duration(self.train_time)} of training: "
                f"{m.format(self.final_accuracy)} (best {m.format(self.best_accuracy)}, "
                f"{self.epochs:.2f} epochs).")

"""Summaries of a run from its metric events: progress, phases over all workers, throughput.

Aggregates over every worker (mean, max and per rank), not rank 0 alone (docs/tasks.md, "What is
timed"): in synchronous training the slowest worker sets the pace, and a straggler shows up as
a gap between the mean and the max.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from statistics import mean
from typing import Any

from mlbench.timing import PHASES

COMPUTE_PHASES = ("data", "forward", "backward", "optimizer")


@dataclass
class RunSummary:
    ranks: list[int] = field(default_factory=list)
    phase_seconds: dict[int, dict[str, float]] = field(default_factory=dict)   # rank -> phase -> s
    eval_seconds: dict[int, float] = field(default_factory=dict)
    steps: int = 0
    epoch: float = 0.0
    samples: int = 0                       # over all workers
    bytes_sent: dict[int, int] = field(default_factory=dict)
    dense_bytes: dict[int, int] = field(default_factory=dict)   # what the reference all-reduce sends
    collectives: dict[int, int] = field(default_factory=dict)   # collectives the training steps issued
    train_time: float = 0.0                # max over ranks of the latest training-time reading
    last_train_loss: float | None = None
    last_lr: float | None = None
    #: rank 0's evaluations: epoch, step, time, loss and each metric by name (accuracy,
    #: perplexity, bleu: every ``eval/<name>`` event)
    evaluations: list[dict[str, float]] = field(default_factory=list)
    result: dict[str, Any] | None = None
    environment: dict[str, Any] | None = None
    #: each rank's ``system`` event: peak memory, peak FLOP/s, FLOPs per step (mlbench.results.sysmetrics)
    systems: dict[int, dict[str, Any]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    skipped_events: int = 0                # unreadable event lines the reader left out

    def phase_stat(self, phase: str, how: str = "mean") -> float:
        values = [self.phase_seconds.get(r, {}).get(phase, 0.0) for r in self.ranks]
        if not values:
            return 0.0
        return max(values) if how == "max" else mean(values)

    def compute_seconds(self, rank: int) -> float:
        return sum(self.phase_seconds.get(rank, {}).get(p, 0.0) for p in COMPUTE_PHASES)

    def communication_seconds(self, rank: int) -> float:
        return self.phase_seconds.get(rank, {}).get("communication", 0.0)

    @property
    def communication_ratio(self) -> float | None:
        """Communication time / compute time, mean over workers."""
        if not self.ranks:
            return None
        comp = mean(self.compute_seconds(r) for r in self.ranks)
        comm = mean(self.communication_seconds(r) for r in self.ranks)
        return comm / comp if comp > 0 else None

    @property
    def compression_ratio(self) -> float | None:
        """Bytes the reference all-reduce (one fp32 all-reduce of all gradients) would have sent
        / bytes sent, over all workers; None when nothing was sent."""
        sent, dense = sum(self.bytes_sent.values()), sum(self.dense_bytes.values())
        return dense / sent if sent > 0 and dense > 0 else None

    @property
    def throughput(self) -> float | None:
        """Training samples per second over all workers."""
        return self.samples / self.train_time if self.train_time > 0 else None


class StepGaps:
    """Counts a resumed run's steps and samples as if it had never stopped.

    A worker records, per logging interval, the steps and samples since its previous record
    (``train/steps``, ``train/samples``, both at the interval's last step). A worker killed and
    resumed from a checkpoint made the steps between its last record and that checkpoint without
    recording them: the resumed worker's first record counts from the checkpoint. Feed every
    ``train/steps`` record to :meth:`steps` and every ``train/samples`` record to :meth:`samples`,
    in the order written: the samples of an interval that follows such a gap are scaled by its
    steps (the batch is the same within a group) so that the run's samples, and the rates made
    from them, count every step done once."""

    def __init__(self) -> None:
        self.reached: dict[int, int] = {}              # rank -> the furthest step recorded
        self._scale: dict[tuple[int, int], float] = {}  # (rank, step) -> (recorded + gap) / recorded

    def steps(self, rank: int, step: int, counted: int) -> None:
        counted = max(counted, 1)
        gap = max(0, step - counted - self.reached.get(rank, 0))
        if gap:
            self._scale[rank, step] = (counted + gap) / counted
        self.reached[rank] = max(self.reached.get(rank, 0), step)

    def samples(self, rank: int, step: int, samples: int) -> int:
        return round(samples * self._scale.get((rank, step), 1.0))


def summarize(events: list[dict[str, Any]]) -> RunSummary:
    """The summary of events as the readers of :mod:`mlbench.results.events` return them (each
    field of its type); their count of skipped lines is carried over."""
    s = RunSummary(skipped_events=getattr(events, "skipped", 0))
    phases: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    gaps = StepGaps()
    samples_by_rank: dict[int, int] = defaultdict(int)
    train_time: dict[int, float] = {}
    evals: dict[int, dict[str, float]] = {}
    ranks = set()
    for e in events:
        value: Any = e.get("value")  # of the type its event's name gives (checked by the readers)
        name, rank = e["name"], int(e.get("rank", 0))
        ranks.add(rank)
        if name.startswith("time/") and name != "time/eval":
            phases[rank][name[5:]] += float(value)
        elif name == "time/eval":
            s.eval_seconds[rank] = s.eval_seconds.get(rank, 0.0) + float(value)
        elif name == "train/steps":
            gaps.steps(rank, int(e["step"]), int(value))
        elif name == "train/samples":
            samples_by_rank[rank] += gaps.samples(rank, int(e["step"]), int(value))
        elif name == "train/time":
            train_time[rank] = max(train_time.get(rank, 0.0), float(value))
        elif name == "comm/bytes":
            s.bytes_sent[rank] = s.bytes_sent.get(rank, 0) + int(value)
        elif name == "comm/dense_bytes":
            s.dense_bytes[rank] = s.dense_bytes.get(rank, 0) + int(value)
        elif name == "comm/collectives":
            s.collectives[rank] = s.collectives.get(rank, 0) + int(value)
        elif name == "train/loss" and rank == 0:
            s.last_train_loss = float(value)
        elif name == "train/lr" and rank == 0:
            s.last_lr = float(value)
        elif name.startswith("eval/") and rank == 0:
            point = evals.setdefault(int(e["step"]), {"epoch": float(e["epoch"]), "step": int(e["step"])})
            point[name[5:]] = float(value)
        elif name == "result":
            s.result = value
        elif name == "environment":
            s.environment = value
        elif name == "system":
            s.systems[rank] = value
        elif name == "error":
            s.errors.append(f"worker {rank}: {value}")
        if name == "train/time" and rank == 0 and int(e["step"]) in evals:
            evals[int(e["step"])]["time"] = float(value)
        s.epoch = max(s.epoch, float(e.get("epoch", 0.0)))
    s.ranks = sorted(ranks)
    s.phase_seconds = {r: dict(phases[r]) for r in s.ranks}
    s.steps = max(gaps.reached.values(), default=0)
    s.samples = sum(samples_by_rank.values())
    s.train_time = max(train_time.values(), default=0.0)
    s.evaluations = [evals[k] for k in sorted(evals)]
    return s


def phase_table(summary: RunSummary) -> list[list[Any]]:
    """Rows: phase, mean seconds, max seconds, share of the step time (mean)."""
    total = sum(summary.phase_stat(p) for p in PHASES)
    rows = []
    for phase in PHASES:
        m = summary.phase_stat(phase)
        rows.append([phase, m, summary.phase_stat(phase, "max"), (m / total) if total else 0.0])
    return rows

"""The systems metrics of a run, from each rank's ``system`` event and its phase times: peak
memory, the spread of the step time over the ranks (stragglers), achieved FLOP/s and the
utilisation of the devices' peak (docs/system-metrics.md).

One computation for every view: `status RUN`, its ``-o json``, `compare` and the dashboard's run
page show these numbers (through :mod:`mlbench.results.report`); none derives its own.

A rank's *step time* is what it spends per step on its own work: the data, forward, backward
and optimizer phases, without the communication phase, in which a fast rank waits for the slow
one. In synchronous training every rank's wall-clock step is the slowest rank's, so only the
busy time tells which rank is the straggler. A run timed without phases (``--no-timing``) has
the wall-clock step (training time / steps) instead, the same on every rank
(:attr:`SystemMetrics.step_basis` says which).

Achieved FLOP/s is against the wall clock (FLOPs of the steps / training time, waiting
included), as model-FLOP utilisation is defined (Chowdhery et al. 2022, PaLM, appendix B).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Any

from mlbench.results.summary import RunSummary

BUSY = "busy"
WALL = "wall"
#: Probes of a CPU's peak that differ by more than this make its utilisation approximate.
PROBE_SPREAD = 1.25


@dataclass
class RankSystem:
    """One rank's systems metrics."""

    rank: int
    peak_rss_bytes: int | None
    cuda_peak_bytes: int | None
    step_seconds: float | None
    flops_per_step: int | None
    achieved_flops: float | None        # FLOP/s
    peak_flops: float | None
    utilisation: float | None           # achieved / peak, between 0 and 1 (a probe may be beaten)
    peak_probes: tuple[float, ...] = ()   # a CPU's probes (FLOP/s): at start and after training

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "peak_probes": list(self.peak_probes)}


@dataclass
class SystemMetrics:
    """A run's systems metrics over its ranks."""

    ranks: list[RankSystem]
    device: str
    peak_source: str
    flops_method: str | None
    step_basis: str                      # BUSY or WALL

    def _values(self, key: str) -> list[Any]:
        return [getattr(r, key) for r in self.ranks if getattr(r, key) is not None]

    @property
    def peak_rss_bytes(self) -> int | None:
        """The largest peak resident memory of a rank."""
        return max(self._values("peak_rss_bytes"), default=None)

    @property
    def cuda_peak_bytes(self) -> int | None:
        return max(self._values("cuda_peak_bytes"), default=None)

    @property
    def step_min(self) -> float | None:
        return min(self._values("step_seconds"), default=None)

    @property
    def step_median(self) -> float | None:
        values = self._values("step_seconds")
        return median(values) if values else None

    @property
    def step_max(self) -> float | None:
        return max(self._values("step_seconds"), default=None)

    @property
    def slowest_rank(self) -> int | None:
        timed = [r for r in self.ranks if r.step_seconds is not None]
        return max(timed, key=lambda r: (r.step_seconds, -r.rank)).rank if timed else None

    @property
    def achieved_flops(self) -> float | None:
        """FLOP/s of all ranks together."""
        values = self._values("achieved_flops")
        return sum(values) if values else None

    @property
    def utilisation(self) -> float | None:
        """All ranks' achieved FLOP/s over all their peaks; None where a rank beat its own
        peak (:attr:`utilisation_note` says why)."""
        pairs = [(r.achieved_flops, r.peak_flops) for r in self.ranks
                 if r.achieved_flops is not None and r.peak_flops]
        if not pairs or self._beaten() is not None:
            return None
        return sum(a for a, _ in pairs) / sum(p for _, p in pairs)

    def _beaten(self) -> RankSystem | None:
        """The rank whose training beat its peak by most, if one did: its peak is wrong."""
        over = [r for r in self.ranks if r.utilisation is not None and r.utilisation > 1.0]
        return max(over, key=lambda r: (r.utilisation or 0.0, -r.rank)) if over else None

    @property
    def probe_spread(self) -> float | None:
        """How far a CPU's probes differ, over every rank and probe: the fastest over the
        slowest (1.0: they agree); None without probes."""
        probes = [p for r in self.ranks for p in r.peak_probes if p > 0]
        return max(probes) / min(probes) if probes else None

    @property
    def utilisation_note(self) -> str | None:
        """Why the utilisation is not shown, or what bounds it; None when nothing does. A CPU's
        peak is its own probe's, which a busy machine slows: a rank that beat it makes the
        utilisation meaningless, and probes that differ make it approximate."""
        beaten = self._beaten()
        if beaten is not None:
            return (f"not shown: rank {beaten.rank} reached {format_flops(beaten.achieved_flops)}, above its "
                    f"{self.peak_source} peak of {format_flops(beaten.peak_flops)} (other processes slowed the "
                    "probe)")
        spread = self.probe_spread
        if spread is not None and spread > PROBE_SPREAD:
            return (f"approximate: the CPU's probes differ {spread:.1f}x over the ranks and the run (other "
                    "processes slowed some)")
        return None

    def to_dict(self) -> dict[str, Any]:
        """The keys of ``status RUN -o json``'s ``system`` (an interface: keys are only added)."""
        return {"device": self.device, "peak_source": self.peak_source, "flops_method": self.flops_method,
                "peak_rss_bytes": self.peak_rss_bytes, "cuda_peak_bytes": self.cuda_peak_bytes,
                "step_basis": self.step_basis, "step_min": self.step_min, "step_median": self.step_median,
                "step_max": self.step_max, "slowest_rank": self.slowest_rank,
                "achieved_flops": self.achieved_flops, "utilisation": self.utilisation,
                "utilisation_note": self.utilisation_note, "probe_spread": self.probe_spread,
                "ranks": [r.to_dict() for r in self.ranks]}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _integer(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def system_metrics(summary: RunSummary) -> SystemMetrics | None:
    """The systems metrics of a summarised run; None before any rank recorded its ``system``
    event (an active run, a run of an older version, a framework that does not record it)."""
    if not summary.systems:
        return None
    busy = all(summary.compute_seconds(r) > 0 for r in summary.systems)
    ranks = []
    for rank in sorted(summary.systems):
        record = summary.systems[rank]
        steps, train_time = _integer(record.get("steps")), _number(record.get("train_time"))
        flops, peak = _integer(record.get("flops_per_step")), _number(record.get("peak_flops"))
        seconds = None
        if steps:
            seconds = summary.compute_seconds(rank) / steps if busy else (train_time or 0.0) / steps
        achieved = flops * steps / train_time if flops is not None and steps and train_time else None
        probes = record.get("peak_probes")
        ranks.append(RankSystem(rank=rank, peak_rss_bytes=_integer(record.get("peak_rss_bytes")),
                                cuda_peak_bytes=_integer(record.get("cuda_peak_bytes")), step_seconds=seconds,
                                flops_per_step=flops, achieved_flops=achieved, peak_flops=peak,
                                utilisation=achieved / peak if achieved is not None and peak else None,
                                peak_probes=tuple(v for v in (_number(p) for p in probes) if v is not None)
                                if isinstance(probes, list) else ()))
    first = summary.systems[min(summary.systems)]
    method = first.get("flops_method")
    return SystemMetrics(ranks=ranks, device=str(first.get("device", "")),
                         peak_source=str(first.get("peak_source", "")),
                         flops_method=method if isinstance(method, str) else None, step_basis=BUSY if busy else WALL)


# -- as text: `status RUN`, `compare` and the dashboard's run page ------------------------------
def format_bytes(count: float | None) -> str:
    """``1.2 GB`` (powers of 1000), ``-`` for unknown."""
    if count is None:
        return "-"
    value = float(count)
    for unit in ("B", "KB", "MB", "GB"):
        if abs(value) < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def format_flops(rate: float | None) -> str:
    """``12.3 GFLOP/s``, ``-`` for unknown."""
    if rate is None:
        return "-"
    for unit, scale in (("PFLOP/s", 1e15), ("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if rate >= scale:
            return f"{rate / scale:.1f} {unit}"
    return f"{rate:.0f} FLOP/s"


def format_fraction(value: float | None) -> str:
    """``12.3%``, ``-`` for unknown."""
    return f"{100 * value:.1f}%" if value is not None else "-"


def _ms(seconds: float | None) -> str:
    return f"{1000 * seconds:.1f} ms" if seconds is not None else "-"


def describe_system(system: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(label, text) rows of ``run_details(...)["system"]`` (:meth:`SystemMetrics.to_dict`),
    for the table of `status RUN` and the dashboard's run page; none without the metrics."""
    if system is None:
        return []
    rows = [("peak memory", f"{format_bytes(system['peak_rss_bytes'])} resident (largest rank)")]
    if system["cuda_peak_bytes"] is not None:
        rows.append(("peak GPU memory", f"{format_bytes(system['cuda_peak_bytes'])} allocated (largest rank)"))
    basis = "busy: without communication" if system["step_basis"] == BUSY else "wall clock"
    rows.append(("step time", f"{_ms(system['step_min'])} / {_ms(system['step_median'])} / "
                              f"{_ms(system['step_max'])} min/median/max over ranks ({basis}); "
                              f"slowest rank {system['slowest_rank']}"))
    peak_of = [r["peak_flops"] for r in system["ranks"] if r["peak_flops"] is not None]
    peak = f"{format_flops(sum(peak_of) / len(peak_of))} per rank ({system['peak_source']}, {system['device']})" \
        if peak_of else f"unknown ({system['device']})"
    method = system["flops_method"]
    if method is None:
        rows.append(("achieved", "not counted for this task's model"))
    else:
        note = system.get("utilisation_note")
        if system["utilisation"] is None and note:
            share = f"utilisation {note}"
        else:
            share = f"{format_fraction(system['utilisation'])} of peak{f' ({note})' if note else ''}"
        rows.append(("achieved", f"{format_flops(system['achieved_flops'])} all ranks ({method} FLOPs per step), "
                                 f"{share}"))
    rows.append(("device peak", peak))
    return rows

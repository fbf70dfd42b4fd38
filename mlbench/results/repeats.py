"""Statistics over repeated runs of one configuration: what a trustworthy time to accuracy is.

One run's time to accuracy moves with the seed (initialisation, data order, augmentation) and with
the machine's load, so a single number is an anecdote. MLPerf Training therefore asks for several
runs per result and scores them with the *olympic mean*: drop the fastest and the slowest run and
average the rest. A run that missed the goal has no time to accuracy; it counts as infinitely slow
(as MLPerf scores a non-converged run: the slowest), so the olympic mean may drop it as the worst
run, but it can never make a result look better, and the count of converged runs is always
reported beside the figures. Nothing is silently left out.

Beside the olympic mean: the 95% confidence interval of the mean (Student's t, computed here without
scipy), MLPerf's own score with its validity rules, whether two families can be told apart at all,
and the one-line summary a reader sees.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from statistics import mean, median, stdev

#: How a run that did not reach the goal enters the statistics: as an infinitely slow run.
NOT_CONVERGED = math.inf

#: The fewest runs MLPerf Training scores (5 for most benchmarks, 10 or more for some).
MLPERF_MIN_RUNS = 5

#: The fewest runs a confidence interval is given for: from fewer, the sample's spread is too unsteady to trust.
INTERVAL_MIN_RUNS = 5

#: z_{0.975}, the standard normal's two-sided 95% quantile.
_Z975 = 1.959963984540054

#: Degrees of freedom up to which the t quantile is solved from the exact CDF; beyond, the
#: Cornish-Fisher expansion is exact to about 1e-12.
_EXACT_DF_LIMIT = 1000


@dataclass(frozen=True)
class RepeatStats:
    """Median, range and olympic mean of one measurement over repeated runs.

    ``values`` are sorted; a run without a value (goal missed) is ``inf``. Every statistic is
    ``inf`` when the runs that did not converge decide it (e.g. the median when half or more missed
    the goal), which the CLI prints as "not converged" rather than as a number.
    """

    values: tuple[float, ...]

    @property
    def runs(self) -> int:
        return len(self.values)

    @property
    def converged(self) -> int:
        return sum(1 for v in self.values if math.isfinite(v))

    @property
    def median(self) -> float:
        return median(self.values) if self.values else NOT_CONVERGED

    @property
    def minimum(self) -> float:
        return self.values[0] if self.values else NOT_CONVERGED

    @property
    def maximum(self) -> float:
        return self.values[-1] if self.values else NOT_CONVERGED

    @property
    def olympic_mean(self) -> float:
        """The mean without the best and the worst run (all runs when there are fewer than 3)."""
        kept = self.values[1:-1] if len(self.values) >= 3 else self.values
        if not kept or not all(math.isfinite(v) for v in kept):
            return NOT_CONVERGED
        return mean(kept)

    @property
    def interval95(self) -> tuple[float, float] | None:
        """The 95% confidence interval of the mean: mean ± t_{0.975, n-1} · s / √n (Student's t).

        Only from at least ``INTERVAL_MIN_RUNS`` runs that all converged: a run without a time has
        no place in a mean, and leaving it out would make the interval look better than the runs
        were. ``None`` otherwise.
        """
        n = len(self.values)
        if n < INTERVAL_MIN_RUNS or self.converged < n:
            return None
        centre = mean(self.values)
        half = t_quantile_975(n - 1) * stdev(self.values) / math.sqrt(n)
        return centre - half, centre + half

    @property
    def mlperf_score(self) -> float | None:
        """MLPerf Training's benchmark result over these runs, or ``None`` where it gives none.

        The rule (MLPerf Training Rules, section "Benchmark Results", as of version 1.0 of 25 March
        2021, https://github.com/mlcommons/training_policies/blob/master/training_rules.adoc): each
        benchmark result is computed by dropping the fastest and the slowest run and taking the
        mean of the remaining times; a single non-converging run may be treated as the slowest run
        and dropped, and a result with more than one non-converging run is invalid. The number of
        runs is fixed per benchmark there (5 for most, 10 for some, 40 for UNet3D, which drops the
        4 fastest and 4 slowest); here any number from ``MLPERF_MIN_RUNS`` up is scored by the
        general rule, one fastest and one slowest dropped. MLPerf then normalises by the reference
        result; this is the time before that normalisation. ``mlperf_note`` says why there is none.
        """
        if len(self.values) < MLPERF_MIN_RUNS or self.runs - self.converged > 1:
            return None
        # sorted, a non-converged run (inf) last: it is the slowest, dropped
        return mean(self.values[1:-1])

    @property
    def mlperf_note(self) -> str:
        """How ``mlperf_score`` was reached, or why there is none (too few runs, too many misses)."""
        n, missed = self.runs, self.runs - self.converged
        if missed > 1:
            return (f"{missed} of {n} runs did not converge: MLPerf allows at most one, "
                    "so no number of further runs gives a score")
        if n < MLPERF_MIN_RUNS:
            more = MLPERF_MIN_RUNS - n
            return (f"{n} run{_s(n)}: MLPerf scores at least {MLPERF_MIN_RUNS}, "
                    f"{more} more run{_s(more)} needed")
        slowest = "the one that did not converge (as the slowest)" if missed else "the slowest"
        return f"mean of {n - 2} of {n} runs, the fastest and {slowest} dropped (MLPerf Training)"


def _s(count: int) -> str:
    return "" if count == 1 else "s"


def _t_abs_below(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` (integer) degrees of freedom, in closed form.

    With θ = atan(t/√df) the probability is a finite series in cos²θ (Abramowitz & Stegun 26.7.3 and 26.7.4):
    for odd df, (2/π)(θ + sinθ·cosθ·(1 + 2/3·cos²θ + 2·4/(3·5)·cos⁴θ + ... up to cos^(df-3)θ));
    for even df, sinθ·(1 + 1/2·cos²θ + 1·3/(2·4)·cos⁴θ + ... up to cos^(df-2)θ).
    """
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2 == 0:
        term = total = 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        return math.sin(theta) * total
    series = 0.0
    if df > 1:
        term = series = 1.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            series += term
    return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * series)


@lru_cache(maxsize=256)
def t_quantile_975(df: int) -> float:
    """t_{0.975, df}: the two-sided 95% quantile of Student's t with ``df`` >= 1 degrees of freedom.

    Solved by bisection of the exact CDF (``_t_abs_below``) up to ``_EXACT_DF_LIMIT``; beyond it, the
    Cornish-Fisher expansion of Abramowitz & Stegun 26.7.5 around z = 1.959964, whose error there is
    below 1e-12. No scipy: it is no dependency of the core.
    """
    if df < 1:
        raise ValueError(f"Student's t needs at least 1 degree of freedom, not {df}")
    if df > _EXACT_DF_LIMIT:
        z = _Z975
        g = ((z**3 + z) / 4,
             (5 * z**5 + 16 * z**3 + 3 * z) / 96,
             (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
             (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160)
        return z + sum(gk / df ** (k + 1) for k, gk in enumerate(g))
    lo, hi = _Z975, 16.0  # t_{0.975} falls from 12.706 (df 1) towards z
    for _ in range(100):
        mid = (lo + hi) / 2
        if _t_abs_below(mid, df) < 0.95:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-13:
            break
    return (lo + hi) / 2


def indistinguishable(a: RepeatStats, b: RepeatStats) -> bool:
    """Whether the ranges of two families overlap, so that their runs cannot tell them apart at that n.

    A range is min..max of the runs, closed at both ends (touching ranges overlap); a family with a
    run that did not converge has its upper end open at inf, and one whose runs all missed is the
    point inf. Why ranges, not means: if two families of 5 runs came from one distribution, all 5 of
    one would fall below all 5 of the other with probability 2/C(10,5), under 1%; with 3 runs each it
    is 2/C(6,3) = 10%. So separate ranges are evidence of a difference, and overlapping ranges mean
    more runs are needed before claiming one. A family without runs tells nothing apart.
    """
    if not a.values or not b.values:
        return True
    return a.minimum <= b.maximum and b.minimum <= a.maximum


def summary_text(stats: RepeatStats, fmt: Callable[[float], str]) -> str:
    """One line for a reader: "n=5, median 12.3 s (11.0 s..14.1 s, 95% CI 11.5 s..13.2 s)".

    ``fmt`` formats one value (e.g. ``lambda s: f"{s:.1f} s"``); inf is written "not converged";
    the converged count follows n when some runs missed; the CI part only when ``interval95`` exists.
    """
    def cell(value: float) -> str:
        return fmt(value) if math.isfinite(value) else "not converged"

    if not stats.values:
        return "n=0, no runs"
    head = f"n={stats.runs}"
    if stats.converged < stats.runs:
        head += f" ({stats.converged} converged)"
    spread = f"{cell(stats.minimum)}..{cell(stats.maximum)}"
    interval = stats.interval95
    if interval is not None:
        spread += f", 95% CI {cell(interval[0])}..{cell(interval[1])}"
    return f"{head}, median {cell(stats.median)} ({spread})"


def repeat_stats(values: Iterable[float | None]) -> RepeatStats:
    """Statistics of repeated measurements; ``None`` (goal not reached) counts as not converged."""
    return RepeatStats(tuple(sorted(NOT_CONVERGED if v is None else float(v) for v in values)))

"""The watchdog's verdict: which rank of a run stalled, judged from its peers' heartbeats.

A worker that stops making progress (a stopped process, a rank that stopped calling the
collectives, a link that drops its packets) leaves its peers waiting in a collective until the
collective's timeout, minutes later, and then the peer that timed out first is blamed. The
watchdog instead reads every rank's heartbeat (:mod:`mlbench.results.heartbeat`) and fails the
run as soon as a rank made no progress for the *bound*:

* ``bound = max(W, 10 x the median step time)``, where ``W`` is the run's ``--watchdog``
  (60 s by default), and at most the startup bound;
* before a rank's first step, during an evaluation and while it saves its results (phases with
  no steps: data loading, compilation, a long evaluation), the *startup bound* ``10 x W``
  applies instead;
* a rank whose heartbeat file is not rewritten for the bound of its phase has stopped answering
  (SIGSTOP, a frozen machine). Its phase's bound: in a phase without steps the heartbeat thread
  itself may be kept from running for long, by native code that holds Python's lock (a
  framework's import, a compilation, TensorFlow's start of its cluster, which took 67 s on a
  loaded machine), so there too the startup bound applies.

Who is blamed: a rank that stopped answering; else the ranks that made no progress while *not*
waiting in a collective (their peers wait for them: a deadlock, a hang outside torch); else,
when every rank waits in a collective (a dropped link: each waits for the other), the ranks
furthest behind, or all of them. Only :func:`judge` decides; the supervisors that own the worker
processes (:mod:`mlbench.launch.supervisor`) or, where none does, the workers themselves
(:mod:`mlbench.worker.heartbeat`) act on it. torch's own collective timeout is set longer
(:func:`collective_timeout_s`), so the watchdog's verdict comes first.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from mlbench.results.heartbeat import Beat
from mlbench.run_config import DEFAULT_WATCHDOG_S

__all__ = ["DEFAULT_WATCHDOG_S", "Stall", "collective_timeout_s", "judge", "startup_bound_s", "step_bound"]

#: The bound is at least this many median step times.
STEP_FACTOR = 10
#: The bound of phases without steps (startup, evaluation, finishing), in multiples of ``--watchdog``.
STARTUP_FACTOR = 10
#: Phases in which the startup bound applies.
LENIENT_PHASES = ("setup", "evaluation", "finishing")


@dataclass(frozen=True)
class Stall:
    """The watchdog's verdict: the ranks to blame and why, in one line."""

    ranks: tuple[int, ...]
    reason: str


def startup_bound_s(watchdog_s: float) -> float:
    return STARTUP_FACTOR * watchdog_s


def collective_timeout_s(watchdog_s: float | None, floor_s: float) -> float:
    """The timeout of torch's collectives: longer than any bound of the watchdog (twice its
    startup bound), so that a stalled rank is named by the watchdog, not by a peer's timeout;
    at least ``floor_s`` (the rendezvous timeout). Without a watchdog: ``floor_s``."""
    if not watchdog_s:
        return floor_s
    return max(floor_s, 2 * startup_bound_s(watchdog_s))


def step_bound(watchdog_s: float, beats: Mapping[int, Beat | None]) -> tuple[float, str]:
    """The bound for ranks that train, and how it was reached (for the reason)."""
    medians = [b.median_step_s for b in beats.values() if b is not None and b.median_step_s]
    if not medians:
        return watchdog_s, f"watchdog bound {_s(watchdog_s)}"
    median = statistics.median(medians)
    bound = min(max(watchdog_s, STEP_FACTOR * median), startup_bound_s(watchdog_s))
    return bound, (f"watchdog bound max({_s(watchdog_s)}, {STEP_FACTOR} x median step "
                   f"{median:.3g} s)" + (" capped at the startup bound" if bound < STEP_FACTOR * median else ""))


def _s(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds >= 10 or float(seconds).is_integer() else f"{seconds:.1f} s"


def _ranks(ranks: Collection[int]) -> str:
    ordered = sorted(ranks)
    return f"rank {ordered[0]}" if len(ordered) == 1 else "ranks " + ", ".join(map(str, ordered))


_BLAME = re.compile(r"(?:^|watchdog: )ranks? (\d+(?:, \d+)*) made no progress")


def blamed_ranks(reason: str) -> tuple[int, ...]:
    """The ranks a verdict's reason blames (a :class:`Stall`'s ``reason``, also after the
    ``watchdog: `` a worker records it with, as a supervisor's reason for a failure quotes it):
    the inverse of its wording, for a supervisor that reads the verdict from a worker's error
    event (a Slurm job's, to shrink away the stalled rank, not the peer whose watchdog exited)
    and for the fault record, which blames a stall that is over only on such a verdict; () for
    any other reason."""
    match = _BLAME.search(reason)
    return tuple(int(r) for r in match.group(1).split(", ")) if match else ()


#: A heartbeat older than this (three of the workers' once-a-second beats) is not fresh: its
#: rank may have stopped, which only the heartbeat's age shows once it is past the bound.
STALE_BEAT_S = 3.0


def judge(beats: Mapping[int, Beat | None], now: float, watchdog_s: float, since: float,
          exited: Collection[int] = ()) -> Stall | None:
    """The verdict on a run's ranks now (unix seconds), or None while none stalled.

    ``beats``: every rank's latest heartbeat (None: none yet); ``since``: when the workers were
    started (the clock of a rank that never wrote a heartbeat); ``exited``: ranks whose process
    ended (their heartbeat stopped for that reason)."""
    bound, how = step_bound(watchdog_s, beats)
    startup = startup_bound_s(watchdog_s)
    live = {rank: beat for rank, beat in beats.items()
            if rank not in exited and (beat is None or beat.phase != "done")}
    if not live:
        return None
    silent = {r: now - since for r, b in live.items() if b is None and now - since > startup}
    if silent:
        return Stall(tuple(sorted(silent)), f"{_ranks(silent)} made no progress for "
                     f"{_s(max(silent.values()))}: never started (startup bound {_s(startup)}, "
                     f"{STARTUP_FACTOR} x the watchdog's {_s(watchdog_s)})")
    known = {r: b for r, b in live.items() if b is not None}
    lenient = {r for r, b in known.items() if b.phase in LENIENT_PHASES or b.step == 0}
    startup_how = f"startup bound {_s(startup)}, {STARTUP_FACTOR} x the watchdog's {_s(watchdog_s)}"
    frozen = {r: b for r, b in known.items() if now - b.time > (startup if r in lenient else bound)}
    if frozen:
        first = frozen[min(frozen)]
        return Stall(tuple(sorted(frozen)), f"{_ranks(frozen)} made no progress for "
                     f"{_s(now - (first.stepped_at or first.started))}: its process stopped "
                     f"answering (last step {first.step}, {first.phase}; "
                     f"{startup_how if min(frozen) in lenient else how})")
    idle: dict[int, float] = {}
    for rank, beat in known.items():
        last = beat.stepped_at if beat.stepped_at is not None else beat.started
        if now - last > (startup if rank in lenient else bound):
            idle[rank] = now - last
    if not idle:
        return None
    # a rank stopped (SIGSTOP) may have written its last heartbeat up to a beat after its last
    # step: idle by its step, not yet frozen by its beat. It is named stopped once that beat is
    # older than the bound (above), at most a beat later; until then no verdict by progress is
    # given that would call it busy (seen on the real node: a pod stopped in its straggler's
    # sleep) or take it for a dropped link and blame its peers too (seen in CI: "no rank made
    # progress" for a torchrun rank stopped in a collective). A rank hung in Python keeps
    # beating (fresh) and is judged at once.
    stale = {r for r in idle if now - known[r].time > STALE_BEAT_S}
    busy = {r for r in idle if not known[r].waiting}
    if busy & stale:
        return None
    if busy:
        culprit = known[min(busy)]
        waiting = sorted(r for r, b in known.items() if r not in busy and b.waiting)
        peers = f"while {_ranks(waiting)} waited for it in a collective" if waiting else "while not in a collective"
        where = f", in {culprit.where}" if culprit.where else ""
        return Stall(tuple(sorted(busy)), f"{_ranks(busy)} made no progress for {_s(idle[min(busy)])} {peers} "
                     f"(last step {culprit.step}, {culprit.phase}{where}; "
                     f"{startup_how if min(busy) in lenient else how})")
    if set(idle) != set(live):
        return None  # some wait for peers that still make progress (or never beat): not yet a verdict
    if stale:   # every rank is idle here, so these are every stale beat
        return None
    steps = {rank: beat.step for rank, beat in known.items()}
    behind = tuple(sorted(r for r, s in steps.items() if s == min(steps.values())))
    if len(behind) < len(live):
        return Stall(behind, f"{_ranks(behind)} made no progress for {_s(max(idle[r] for r in behind))}: "
                     f"stuck at step {min(steps.values())} while its peers waited in a collective at "
                     f"step {max(steps.values())} ({how})")
    return Stall(behind, f"no rank made progress for {_s(min(idle.values()))}: {_ranks(behind)} all wait "
                 f"in a collective at step {min(steps.values())} (a dropped link or a hung peer; {how})")

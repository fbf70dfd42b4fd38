"""One recovery state machine for a run's group of workers, shared by every supervisor.

The local supervisor (:mod:`mlbench.launch.supervisor`), the one inside a Slurm job
(:mod:`mlbench.launch.slurm_supervisor`) and the cluster's (:mod:`mlbench.launch.k8s_supervisor`)
each keep only how they see a failure and how they stop and start a group (processes, a job
step, pods). What a failure means, what ``--on-failure`` does about it, what is recorded and when
the next group may start is decided here, once, for all three:

``RUNNING``
    The group trains. Injected faults fall due on it (:class:`~mlbench.launch.injector.Injector`).
    A failure goes to :meth:`Recovery.failure`, which returns a :class:`Decision`: ``fail`` ends
    the run with its reason; ``restart`` and ``shrink`` go to ``ENDING``.
``ENDING``
    The supervisor stops the failed group (at once; pods: until they are gone). Then it calls
    :meth:`Recovery.group_ended`, which records the restart (``faults.restarts``), goes back to
    the newest valid checkpoint and sets when the next group may start.
``BACKING_OFF``
    Until :meth:`Recovery.may_start`: at once after a group that made progress (a new complete
    checkpoint past the step it started from); else a crash-loop back-off, as Kubernetes' for a
    container that keeps failing: :data:`BACKOFF_FIRST_S`, doubled for each further restart in a
    row without progress, at most :data:`BACKOFF_MAX_S`.
``RECOVERING``
    The new group runs (:meth:`Recovery.started`) until every rank made a step past the
    checkpoint: then the time to recover is recorded and the state is ``RUNNING`` again.

A fault due in ``ENDING``, ``BACKING_OFF`` or ``RECOVERING`` strikes nothing: it is recorded as
missed, saying which restart it fell in (a kill of the group being replaced would only name a
process that is going; one of the new group, before it is back, would be counted as a second
failure of a recovery the first has not finished). Several ranks that fail together (killed at
one moment, or every open kill of the group when one of them is seen) are one failure: one
restart entry names every rank and every fault, and a shrink leaves all of them out.
Failures that no restart can mend (:func:`mlbench.launch.run_folder.permanent_failure`) end the
run at once whatever the policy. docs/faults.md states the rules.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlbench.launch.injector import (
    FaultRecord,
    Injector,
    Network,
    Process,
    check_recovered,
    group_progressed,
    next_group,
    reached_step,
    record_restart,
    restart_counts,
    signal_pid,
    uncounted_note,
)
from mlbench.launch.run_folder import permanent_failure
from mlbench.run_config import RunDocument

RUNNING, ENDING, BACKING_OFF, RECOVERING = "running", "ending", "backing off", "recovering"
#: The back-off before the first restart of a group that made no progress, seconds; doubled for
#: each further restart in a row without progress (Kubernetes' CrashLoopBackOff: 10 s doubled up
#: to 5 minutes; shorter here, where a group starts in seconds).
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0


def backoff_s(restarts: Sequence[Mapping[str, Any]], progressed: bool) -> float:
    """The seconds to wait before starting the group again after a failure: 0 when the failed
    group ``progressed`` (a failure after progress is the fault schedule, not a crash loop), else
    :data:`BACKOFF_FIRST_S` doubled for each restart before it, in a row, whose group made no
    progress either (``restarts``: ``faults.restarts`` so far, each with its ``progressed``)."""
    if progressed:
        return 0.0
    in_a_row = 0
    for entry in reversed(restarts):
        if entry.get("progressed", True):
            break
        in_a_row += 1
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** in_a_row)


@dataclass
class Decision:
    """What the policy does after one failure (:meth:`Recovery.failure`)."""

    action: str                   # "restart", "shrink" or "fail"
    reason: str                   # the failure, with the injected faults it is put down to
    ranks: list[int]              # every rank the failure is put down to
    faults: list[dict[str, Any]] = field(default_factory=list)   # the fault events it answers
    survivors: list[int] | None = None   # shrink: the old ranks that go on, in order
    counted: bool = True          # against --on-failure restart:N (restart_counts)
    reached: int = 0              # the furthest step a worker of the failed group reached
    backoff_s: float = 0.0        # the wait before the next group starts
    progressed: bool = True       # the failed group wrote a new complete checkpoint
    given_up: str = ""            # fail: what the run's reason adds (" (after 3 restarts, ...)"), "" for fail itself

    @property
    def goes_on(self) -> bool:
        return self.action != "fail"


class Recovery:
    """The recovery of one run's group (see the module's docstring). ``send`` delivers a signal
    to one worker (by pid on this machine unless told otherwise); the supervisor starts the fault
    clock with :meth:`start_clock` when its workers first start."""

    def __init__(self, run_dir: Path, send: Callable[[Process, int], None] = signal_pid):
        self.run_dir = run_dir
        config = RunDocument.load(run_dir).config
        self.schedules = config.faults
        self.policy, self.max_restarts = config.on_failure, config.max_restarts
        self.workers = config.workers   # the group's size now (smaller than the run's after a shrink)
        self.record: FaultRecord | None = FaultRecord(run_dir) if config.faults or config.on_failure != "fail" else None
        self.send = send
        self.injector: Injector | None = None
        self.clock_start: float | None = None
        self.state = RUNNING
        self.decision: Decision | None = None   # ENDING: the restart to record once the group is gone
        self.entry: dict[str, Any] | None = None   # BACKING_OFF, RECOVERING: the restart's entry
        self.start_at = 0.0

    # -- the fault clock and the schedules

    def start_clock(self, clock_start: float | None = None, passed: float | None = None) -> float:
        """Start the fault clock once (later calls keep it): at ``clock_start`` (unix seconds),
        else now less the seconds it ran under the run's earlier supervisors (``mlbench
        resume``, a requeued job: :meth:`FaultRecord.clock_so_far`), from which the injector
        strikes each moment once over the run. Returns the clock's start."""
        if self.clock_start is None:
            so_far = self.record.clock_so_far() if self.record is not None else None
            self.clock_start = clock_start if clock_start is not None else time.time() - (so_far or 0.0)
            if self.schedules and self.record is not None:
                self.injector = Injector(self.schedules, self.clock_start, self.record, self.send,
                                         passed=so_far if passed is None else passed)
        return self.clock_start

    def tick(self, procs: Sequence[Process], network: Network | None = None) -> None:
        """One look: what of the schedules fell due is struck on ``procs`` (recorded as missed
        while a restart is under way), and a recovering group that is back is running again."""
        if self.injector is not None:
            self.injector.network = network
            self.injector.apply(procs, missed=self._missed_reason())
        if self.state == RECOVERING and self.entry is not None and self.record is not None \
                and check_recovered(self.record, self.entry, self.workers):
            self.state, self.entry = RUNNING, None

    def _missed_reason(self) -> str | None:
        if self.state == RUNNING:
            return None
        number = len(self.record.restarts) + (self.state == ENDING) if self.record is not None else 0
        return f"due during the recovery from failure {number} ({self.state})"

    def save_clock(self) -> None:
        """Record the seconds the fault clock ran (a supervisor that stops, however the run
        ends); a full disk is said, not raised: the run must still end in the store."""
        if self.record is not None and self.clock_start is not None:
            try:
                self.record.record_clock(self.clock_start)
            except OSError as err:
                print(f"mlbench: the fault clock was not recorded in run.json ({err})", file=sys.stderr)

    # -- a failure and what follows it

    def failure(self, ranks: Sequence[int], reason: str, now: float | None = None,
                codes: Mapping[int, int | None] | None = None) -> Decision:
        """Workers ``ranks`` died or stalled (``reason``; ``codes``: their exit codes where the
        supervisor knows them): the failure put down to every injected fault that explains it,
        and what the policy does. ``restart`` and ``shrink`` leave the machine in ``ENDING``:
        the supervisor stops the group, then calls :meth:`group_ended`; ``fail`` records the
        faults' action, and the supervisor ends the run with the decision's ``reason`` and
        ``given_up``."""
        now = time.time() if now is None else now
        faults: list[dict[str, Any]] = []
        if self.record is not None:
            reason, faults = self.record.blame_all(ranks, reason, now)
        blamed = sorted({int(f["rank"]) for f in faults}) or sorted(set(ranks))
        permanent = permanent_failure(self.run_dir, sorted(set(ranks) | set(blamed)), codes)
        counts = restart_counts(self.run_dir, self.workers, faults[0] if faults else None)
        restarts = self.record.own_restarts if self.record is not None else []
        survivors, given_up = next_group(self.policy, self.max_restarts, restarts, self.workers, blamed,
                                         counts=counts, permanent=permanent)
        if self.record is None or given_up is not None:
            for fault in faults:
                fault["action"] = "fail"
            self._save()
            return Decision("fail", reason, blamed, faults, given_up=given_up or "")
        progressed = group_progressed(self.run_dir, self.workers)
        first_fault = min((float(f["time"]) for f in faults), default=None)
        decision = Decision("shrink" if survivors is not None else "restart", reason, blamed, faults, survivors,
                            counts, reached_step(self.run_dir, self.workers, first_fault),
                            backoff_s(self.record.restarts, progressed), progressed)
        self.state, self.decision = ENDING, decision
        return decision

    def group_ended(self, now: float | None = None) -> dict[str, Any]:
        """The failed group is gone (no worker of it alive, none writing a checkpoint): record
        the restart and go back to the newest valid checkpoint (renumbered for a shrink's
        survivors); the next group may start once the back-off is over (:meth:`may_start`).
        Returns the restart's entry."""
        assert self.state == ENDING and self.decision is not None and self.record is not None
        decision = self.decision
        if self.injector is not None:
            self.injector.forget_processes()
        entry = record_restart(self.record, self.workers, decision.reason, decision.faults,
                               time.time() if now is None else now, decision.reached, decision.survivors,
                               decision.counted, ranks=decision.ranks, progressed=decision.progressed,
                               backoff_s=decision.backoff_s)
        if decision.survivors is not None:
            self.workers = len(decision.survivors)
        self.state, self.decision, self.entry = BACKING_OFF, None, entry
        self.start_at = time.time() + decision.backoff_s
        return entry

    def may_start(self, now: float | None = None) -> bool:
        """Whether the next group may start now (its back-off is over)."""
        return self.state == BACKING_OFF and (time.time() if now is None else now) >= self.start_at

    def started(self) -> None:
        """The next group was started: recovering until every rank is past the checkpoint. The
        restart's entry records when (``started_at``: the errors a worker recorded before it
        are the failed group's, :mod:`mlbench.results.timeline`)."""
        if self.state == BACKING_OFF:
            self.state = RECOVERING
            if self.entry is not None and self.record is not None:
                self.entry["started_at"] = time.time()
                self._save()

    def line(self, entry: Mapping[str, Any]) -> str:
        """The supervisor's line about a restart or a shrink, as every supervisor prints it."""
        number = len(self.record.own_restarts) if self.record is not None else 0
        wait = f"; in {entry['backoff_s']:g}s (no progress since the last start)" if entry.get("backoff_s") else ""
        survivors = entry.get("survivors")
        if survivors is None:
            return f"{entry['reason']}; restart {number} from step {entry['from_step']}{uncounted_note(entry)}{wait}"
        old = f"old rank{'s' if len(survivors) > 1 else ''} {', '.join(map(str, survivors))}"
        return (f"{entry['reason']}; shrink {number}: {len(survivors)} of {len(survivors) + len(entry['ranks'])} "
                f"worker(s) go on from step {entry['from_step']} ({old}){wait}")

    def _save(self) -> None:
        if self.record is None:
            return
        try:
            self.record.save()
        except OSError as err:   # a full disk: the run must still end in the store, saying why
            print(f"mlbench: the faults were not recorded in run.json ({err})", file=sys.stderr)


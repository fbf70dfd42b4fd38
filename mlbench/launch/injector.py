"""The faults of ``--inject``, applied for real to a local run's worker processes, and their record.

The supervisor (:mod:`mlbench.launch.supervisor`) asks :meth:`Injector.apply` at every look at
its workers; whatever of the run's schedules (:mod:`mlbench.results.faults`) fell due since the
last look is done then: ``kill`` sends SIGKILL to the rank's process, ``stall`` SIGSTOP (and
SIGCONT ``for`` seconds later, unless the process is gone by then), ``link-down`` takes the
rank's port of the emulated network's bridge down and up again ``for`` seconds later
(:meth:`mlbench.network.emulation.LocalNetwork.set_link`; the event's ``down_s`` is how long it
really was down, as a stall's ``stopped_s`` is how long its process was stopped: until SIGCONT,
or until the group was replaced). A ``slow`` schedule is
applied by the worker itself (:mod:`mlbench.worker.straggler`: the supervisor cannot slow a
process's compute without stopping it) and only recorded here, when each window begins.

Every fault is one event in run.json (``faults.events``): its kind, rank, the schedule's moment
on the fault clock (``at``), when it was applied (unix ``time``) and, once known, how the run
dealt with it (``detected_s``, ``action``, ``lost_steps``, ``recovered_s``), so that a schedule
and its consequences can be read back and compared across runs and policies
(:mod:`mlbench.results.goodput`). Each restart of the group is one entry of ``faults.restarts``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from mlbench.errors import MlbenchError
from mlbench.results.checkpoints import (
    checkpoint_root,
    complete_checkpoints,
    renumber_checkpoints,
)
from mlbench.results.faults import KILL, LINK_DOWN, SLOW, STALL, describe_fault, start_times
from mlbench.results.goodput import FAULTS_SECTION, recoveries
from mlbench.launch.run_folder import back_to_newest_checkpoint
from mlbench.results.heartbeat import Beat, read_beats
from mlbench.results.watchdog import blamed_ranks
from mlbench.run_config import RunDocument


class Process(Protocol):
    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...


class FaultRecord:
    """run.json's ``faults`` section: the applied faults and the restarts, saved on each change,
    and ``clock_s``: the seconds the fault clock had run when the run's supervisor last stopped
    (``mlbench resume`` goes on from there)."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        document = RunDocument.load(run_dir)
        section = document.extra.get(FAULTS_SECTION) or {}
        self.events: list[dict[str, Any]] = list(section.get("events") or [])
        self.restarts: list[dict[str, Any]] = list(section.get("restarts") or [])
        clock = section.get("clock_s")
        self.clock_s: float | None = float(clock) if isinstance(clock, (int, float)) else None

    @property
    def own_restarts(self) -> list[dict[str, Any]]:
        """The restarts (or shrinks) since the run's latest resume (``mlbench resume``, a
        requeued Slurm job), whose ``--on-failure`` limit they count against: each resume starts
        the count afresh; a supervisor started again in between (a cluster's, when the service's
        pod is replaced) goes on counting."""
        resumes = RunDocument.load(self.run_dir).resumes
        since = max((float(r["at"]) for r in resumes if isinstance(r.get("at"), (int, float))), default=None)
        return [r for r in self.restarts if since is None or float(r.get("at") or 0.0) >= since]

    def save(self) -> None:
        document = RunDocument.load(self.run_dir)
        section: dict[str, Any] = {"events": self.events, "restarts": self.restarts}
        if self.clock_s is not None:
            section["clock_s"] = self.clock_s
        document.extra[FAULTS_SECTION] = section
        document.save(self.run_dir)

    def record_clock(self, clock_start: float) -> None:
        """Save the seconds the fault clock that started at ``clock_start`` has run: a supervisor
        that stops (however the run or job ends) leaves them for the next start to go on from."""
        self.clock_s = round(time.time() - clock_start, 3)
        self.save()

    def clock_so_far(self) -> float | None:
        """Where the fault clock of a run started again goes on from: the seconds recorded when
        its supervisor stopped; without them (a supervisor that was killed, as a cluster's when
        the service's pod is replaced), the latest fault's moment, which was struck (a straggler's
        at 0.0 too); None for a run whose clock never ran."""
        if self.clock_s is not None:
            return self.clock_s
        return max((float(e["at"]) for e in self.events if isinstance(e.get("at"), (int, float))), default=None)

    def culprit(self, ranks: Sequence[int], hung: Sequence[int] = ()) -> dict[str, Any] | None:
        """The fault a failure of ``ranks`` is blamed on: the latest kill or stall of one of
        them not yet dealt with, else the latest of any rank (a killed worker's peer may be seen
        to fail first); None for a failure no injected fault explains. A stall or link-down that
        is over (its process continued or replaced, its link up again) was survived: it explains
        a failure only through a watchdog's verdict that names its rank (``hung``: the verdict,
        made while it lasted, may be acted on a moment after it ended), not a later death."""
        open_faults = [e for e in self.events if e["kind"] in (KILL, STALL, LINK_DOWN) and "action" not in e
                       and not e.get("missed") and (not _over(e) or e["rank"] in hung)]
        mine = [e for e in open_faults if e["rank"] in ranks]
        chosen = mine or open_faults
        return chosen[-1] if chosen else None

    def blame_all(self, ranks: Sequence[int], reason: str,
                  now: float) -> tuple[str, list[dict[str, Any]]]:
        """The failure of ``ranks`` (``reason``, seen at ``now``) put down to every injected
        fault that explains it: the one :meth:`culprit` finds, the other open faults of
        ``ranks``, and every kill struck on the group that no failure answered yet (killed
        workers cannot go on, whichever of them was noticed first: one failure, not one per
        rank). Each one's time to detect it is recorded. Returns ``reason`` with the faults
        named, and the faults in the order they struck ([] with ``reason`` as it is when none
        explains it). Every supervisor (local, inside a Slurm job, on a cluster) words it alike."""
        first = self.culprit(ranks, blamed_ranks(reason))
        if first is None:
            return reason, []
        faults = [e for e in self.events if e is first or (
            "action" not in e and not e.get("missed") and (
                e["kind"] == KILL or (e["kind"] in (STALL, LINK_DOWN) and e["rank"] in ranks and not _over(e))))]
        for fault in faults:
            fault["detected_s"] = round(now - fault["time"], 3)
        named = "; ".join(f"{describe_fault(f)}, --inject {f['schedule']}" for f in faults)
        return f"{reason} [injected: {named}]", faults


class Network(Protocol):
    def set_link(self, rank: int, up: bool) -> None: ...


def _over(event: dict[str, Any]) -> bool:
    """Whether a stall's or link-down's effect has ended (see :meth:`FaultRecord.culprit`)."""
    return "stopped_s" in event or "down_s" in event


def signal_pid(proc: Process, sig: int) -> None:
    """Send ``sig`` to a process of this machine (the workers of a local run)."""
    _signal(proc.pid, sig)


class Injector:
    """Applies a run's kill and stall schedules to its worker processes on the fault clock that
    started at ``clock_start`` (unix seconds; earlier than now by the ``passed`` seconds of the
    clock so far when a run is resumed); ``send`` delivers a signal to one of them (by pid
    on this machine unless told otherwise: a Slurm task on another node)."""

    def __init__(self, schedules: list[dict[str, Any]], clock_start: float, record: FaultRecord,
                 send: Callable[[Process, int], None] = signal_pid, passed: float | None = None):
        self.schedules = schedules
        self.clock_start = clock_start
        self.record = record
        self.send = send
        # the moments up to ``passed`` (FaultRecord.clock_so_far: the seconds the clock ran under
        # a stopped supervisor of the run, which ``mlbench resume`` goes on from), moment 0.0
        # included, were struck then: not again; None: the clock never ran
        self._applied = [len(start_times(s, passed)) if passed is not None else 0 for s in schedules]
        self._continue: list[tuple[float, Process, dict[str, Any]]] = []   # (unix time, process, event) to SIGCONT
        self._stopped: list[dict[str, Any]] = []   # the stalls whose process is stopped now
        self._links: list[tuple[float, dict[str, Any]]] = []   # (unix time, event) to bring up
        self.network: Network | None = None   # the emulated network of the group now

    def clock(self, now: float | None = None) -> float:
        """Seconds on the fault clock."""
        return (time.time() if now is None else now) - self.clock_start

    def apply(self, procs: Sequence[Process], missed: str | None = None) -> list[dict[str, Any]]:
        """Do what fell due; returns the new fault events (also saved in run.json). ``missed``:
        why nothing is to be struck now (a restart is under way,
        :mod:`mlbench.launch.recovery`): each kill, stall or link-down due is recorded as missed
        with it (a slowdown is the worker's own, and recorded as it begins)."""
        now = time.time()
        new: list[dict[str, Any]] = []
        for due in list(self._continue):
            proc_due, proc, stall = due
            if proc_due <= now:
                self._continue.remove(due)
                if proc.poll() is None:
                    self.send(proc, signal.SIGCONT)
                self._end_stall(stall, now)
        for up_due, event in list(self._links):
            if up_due <= now:
                self._links.remove((up_due, event))
                self._set_link(event, True, now)
        for index, schedule in enumerate(self.schedules):
            for moment in start_times(schedule, self.clock(now))[self._applied[index]:]:
                struck = self._strike(schedule, moment, procs, now, missed)
                if struck is None:   # its worker runs but cannot be reached yet: struck when it can
                    break
                new.append(struck)
                self._applied[index] += 1
        if new:
            self.record.events.extend(new)
            self.record.save()
        return new

    def _strike(self, schedule: dict[str, Any], moment: float, procs: Sequence[Process],
                now: float, missed: str | None = None) -> dict[str, Any] | None:
        """The event of one due moment of ``schedule``, applied; None while its worker runs but
        has no pid yet (a Slurm task before its first heartbeat, still importing: a forked local
        rank is struck in that phase too), so that the moment is struck on a later call."""
        kind, rank = schedule["kind"], schedule["rank"]
        proc = procs[rank] if rank < len(procs) else None
        if kind != SLOW and missed is None and proc is not None and proc.poll() is None and not proc.pid:
            return None
        event: dict[str, Any] = {"kind": kind, "rank": rank, "at": round(moment, 3), "time": now,
                                 "schedule": schedule["text"]}
        if kind == SLOW:
            event["factor"] = schedule["factor"]
            event["for"] = schedule.get("for")
            return event
        if missed is not None:
            event["missed"] = missed
            return event
        if proc is None or proc.poll() is not None:
            event["missed"] = "the worker was not running (starting again, or ended)"
            return event
        if kind == LINK_DOWN:
            event["for"] = schedule["for"]
            if self._set_link(event, False, now):
                self._links.append((now + float(schedule["for"]), event))
        elif kind == KILL:
            self.send(proc, signal.SIGKILL)
        else:
            self.send(proc, signal.SIGSTOP)
            self._stopped.append(event)
            if schedule.get("for") is not None:
                event["for"] = schedule["for"]
                self._continue.append((now + float(schedule["for"]), proc, event))
        return event

    def _end_stall(self, event: dict[str, Any], now: float) -> None:
        """The stall ``event`` is over: its process continued, or replaced with its group."""
        if event in self._stopped:
            self._stopped.remove(event)
            event["stopped_s"] = round(now - event["time"], 3)
            self.record.save()

    def _set_link(self, event: dict[str, Any], up: bool, now: float) -> bool:
        """Take the event's rank's link down (or bring it up, recording ``down_s``); False,
        with the event marked missed, when there is no network to do it on."""
        if self.network is None:
            event["missed"] = "the emulated network was not running"
            return False
        try:
            self.network.set_link(event["rank"], up)
        except (OSError, subprocess.SubprocessError, MlbenchError) as err:   # recorded, not raised
            event["error"] = f"could not set the link {'up' if up else 'down'}: {err}"
            self.record.save()
            return False
        if up:
            event["down_s"] = round(now - event["time"], 3)
            self.record.save()
        return True

    def forget_processes(self) -> None:
        """The group is being replaced: no stalled process of it is to be continued, and its
        emulated network (whose links were down) goes with it."""
        self._continue.clear()
        now = time.time()
        for stall in list(self._stopped):
            self._end_stall(stall, now)
        for _, event in self._links:
            event["down_s"] = round(now - event["time"], 3)
        self._links.clear()


def reached_step(run_dir: Path, workers: int, failed_at: float | None = None) -> int:
    """The furthest step any worker reached: what a restart loses beyond its checkpoint.

    A heartbeat is written once a second, so a worker killed at ``failed_at`` (an injected
    fault's time) may have made many steps since its last one: those are counted from the step
    time it reported (its steps since then, at its median pace), for a worker that was training.
    Without ``failed_at`` (a failure nobody injected, a hang) the heartbeats' steps are taken as
    they are."""
    def reached(beat: Beat) -> int:
        if failed_at is None or beat.phase != "training" or not beat.median_step_s or beat.stepped_at is None:
            return beat.step
        return beat.step + int(max(0.0, failed_at - beat.stepped_at) / beat.median_step_s)

    return max((reached(b) for b in read_beats(run_dir, workers).values() if b), default=0)


def restart_counts(run_dir: Path, workers: int, fault: dict[str, Any] | None) -> bool:
    """Whether restarting the failed group of ``workers`` counts against ``--on-failure
    restart:N``. A failure no injected fault explains (``fault`` None) counts: N bounds what a
    real fault may cost, as torchrun's ``--max-restarts`` does. An injected fault does not count
    when the failed group had written a complete checkpoint past the step it started from: the
    schedule is the experiment (a kill every 90 s of an hour's run is 40 kills), and that
    progress shows the run is not going round in circles. One that came before any such
    checkpoint counts, so a schedule faster than the checkpoints ends after N restarts instead
    of restarting for ever. Kubernetes' podFailurePolicy (``Ignore`` for disruptions) and
    JobSet's ``RestartJobSetAndIgnoreMaxRestarts`` leave failures that are not the job's out of
    its limit alike. The supervisors pass the answer to :func:`record_restart` (``counted``)."""
    return fault is None or not group_progressed(run_dir, workers)


def group_progressed(run_dir: Path, workers: int) -> bool:
    """Whether the group of ``workers`` wrote a complete checkpoint past the step it started from
    (run.json's ``resume_step``): what :func:`restart_counts` and the recovery's back-off ask."""
    config = RunDocument.load(run_dir).config
    newest = complete_checkpoints(checkpoint_root(run_dir, config.checkpoint_dir), workers).newest
    return newest is not None and newest > (config.resume_step or 0)


def next_group(on_failure: str, max_restarts: int, restarts: Sequence[Mapping[str, Any]], workers: int,
               blamed: Sequence[int], counts: bool = True,
               permanent: str | None = None) -> tuple[list[int] | None, str | None]:
    """What ``--on-failure`` does after the ranks ``blamed`` of a group of ``workers`` failed,
    with ``restarts`` (``faults.restarts`` entries) behind it under this limit; the one rule of
    the local supervisor, the one inside a Slurm job and the cluster's. ``(None, None)``:
    restart at the same size (``restart:N``, while fewer than N restarts that count were done,
    or always when this one does not count: ``counts``, :func:`restart_counts`);
    ``(survivors, None)``: go on with them, their old ranks in order (``shrink`` while one is
    left, ``shrink:N`` at most N times); ``(None, why)``: give up, ``why`` being what the
    failure's reason adds (``""`` when nothing: ``fail``). ``permanent``: why the failure is one
    no restart can mend (:func:`mlbench.launch.run_folder.permanent_failure`): then no policy
    restarts or shrinks, and the run ends at once saying so."""
    if permanent is not None and on_failure != "fail":
        return None, f" ({permanent}, which no restart can mend)"
    counted = sum(1 for entry in restarts if entry.get("counted", True))
    if on_failure == "restart" and (not counts or counted < max_restarts):
        return None, None
    survivors = [rank for rank in range(workers) if rank not in blamed]
    shrinks_left = not max_restarts or len(restarts) < max_restarts
    if on_failure == "shrink" and survivors and shrinks_left:
        return survivors, None
    if on_failure == "shrink" and not survivors:
        return None, " (no worker left to shrink to)"
    done = counted if on_failure == "restart" else len(restarts)
    if done:
        free = len(restarts) - done
        besides = f", besides {free} after injected faults, which do not count" if free else ""
        return None, f" (after {recoveries({'restarts': done, 'on_failure': on_failure})}, " \
                     f"the most --on-failure allowed{besides})"
    return None, ""


def uncounted_note(entry: Mapping[str, Any]) -> str:
    """What a supervisor's line about a restart adds when it did not count against
    ``restart:N`` (:func:`restart_counts`): ``""`` when it did, or for a shrink."""
    return ", not counted (an injected fault after a checkpoint)" if entry.get("counted") is False else ""


def record_restart(record: FaultRecord, workers: int, reason: str, faults: Sequence[dict[str, Any]],
                   now: float, reached: int, survivors: list[int] | None = None,
                   counted: bool = True, ranks: Sequence[int] = (), progressed: bool = True,
                   backoff_s: float = 0.0) -> dict[str, Any]:
    """A group that failed at step ``reached`` goes on from its newest complete checkpoint
    (from the beginning without one): run.json's ``resume_step`` names it, the restart and the
    steps it loses are recorded (``faults.restarts``, each answered fault's ``action``; a
    restart's ``counted``: whether it counted against ``restart:N`` when it was decided,
    :func:`restart_counts`; on a cluster the workers' checkpoint at their stop comes after),
    the checkpoints a killed writer left incomplete and the old group's heartbeats go. Call it
    only while no worker of the run is alive; every supervisor does, through
    :meth:`mlbench.launch.recovery.Recovery.group_ended`. ``ranks``: every rank the failure was
    put down to; ``faults``: the fault events it answers; ``progressed``, ``backoff_s``: whether
    the failed group wrote a new checkpoint, and the wait before the next group starts. With
    ``survivors`` (``--on-failure shrink``: the old ranks that go on), the new group has one
    worker per survivor, ranked in their order, and starts from their files of the checkpoint,
    renumbered here (docs/faults.md states the rules for the new size).
    Returns the restart's entry (:func:`check_recovered` completes it)."""
    run_dir = record.run_dir
    document = RunDocument.load(run_dir)
    config = document.config
    newest = back_to_newest_checkpoint(run_dir, document, workers) or 0
    if survivors is not None:
        renumber_checkpoints(checkpoint_root(run_dir, config.checkpoint_dir), workers, survivors)
        config.workers = len(survivors)
    document.save(run_dir)
    reached = max(reached, newest)   # every worker wrote the checkpoint it goes back to
    indices = [record.events.index(f) for f in faults]
    entry = {"at": now, "reason": reason, "ranks": sorted(ranks), "from_step": newest, "reached_step": reached,
             "lost_steps": max(0, reached - newest), "fault": indices[0] if indices else None,
             "faults": indices, "progressed": progressed, "backoff_s": backoff_s}
    if survivors is not None:
        entry.update(workers=len(survivors), survivors=survivors)
    else:   # against --on-failure restart:N (restart_counts)
        entry["counted"] = counted
    record.restarts.append(entry)
    for fault in faults:
        fault.update(action="restart" if survivors is None else "shrink", lost_steps=entry["lost_steps"])
    record.save()
    return entry


def check_recovered(record: FaultRecord, entry: dict[str, Any], workers: int) -> bool:
    """Whether the group restarted by ``entry`` is back: every rank made a step past the
    checkpoint (seen in its heartbeat, within the second it takes to be rewritten); then the
    time to recover is recorded, in the entry and each fault it answered."""
    beats = read_beats(record.run_dir, workers).values()
    if not all(b is not None and b.step > entry["from_step"] for b in beats):
        return False
    entry["recovered_s"] = round(time.time() - entry["at"], 3)
    answered = entry.get("faults") or ([entry["fault"]] if entry.get("fault") is not None else [])
    for index in answered:
        record.events[index]["recovered_s"] = entry["recovered_s"]
    record.save()
    return True


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass

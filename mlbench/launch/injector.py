"""The faults of ``--inject``, applied for real to a local run's worker processes, and their record.

The supervisor (:mod:`mlbench.launch.supervisor`) asks :meth:`Injector.apply` at every look at
its workers; whatever of the run's schedules (:mod:`mlbench.results.faults`) fell due since the
last look is done then: ``kill`` sends SIGKILL to the rank's process, ``stall`` SIGSTOP (and
SIGCONT ``for`` seconds later, unless the process is gone by then), ``link-down`` takes the
rank's port of the emulated network's bridge down and up again ``for`` seconds later
(:meth:`mlbench.network.emulation.LocalNetwork.set_link`; the event's ``down_s`` is how long it
really was down). A ``slow`` schedule is
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from mlbench.errors import MlbenchError
from mlbench.results.faults import KILL, LINK_DOWN, SLOW, STALL, start_times
from mlbench.results.goodput import FAULTS_SECTION
from mlbench.run_config import RunDocument


class Process(Protocol):
    pid: int

    def poll(self) -> int | None: ...


class FaultRecord:
    """run.json's ``faults`` section: the applied faults and the restarts, saved on each change."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        document = RunDocument.load(run_dir)
        section = document.extra.get(FAULTS_SECTION) or {}
        self.events: list[dict[str, Any]] = list(section.get("events") or [])
        self.restarts: list[dict[str, Any]] = list(section.get("restarts") or [])

    def save(self) -> None:
        document = RunDocument.load(self.run_dir)
        document.extra[FAULTS_SECTION] = {"events": self.events, "restarts": self.restarts}
        document.save(self.run_dir)

    def culprit(self, ranks: Sequence[int]) -> dict[str, Any] | None:
        """The fault a failure of ``ranks`` is blamed on: the latest kill or stall of one of
        them not yet dealt with, else the latest of any rank (a killed worker's peer may be seen
        to fail first); None for a failure no injected fault explains."""
        open_faults = [e for e in self.events if e["kind"] in (KILL, STALL, LINK_DOWN) and "action" not in e
                       and not e.get("missed")]
        mine = [e for e in open_faults if e["rank"] in ranks]
        chosen = mine or open_faults
        return chosen[-1] if chosen else None


class Network(Protocol):
    def set_link(self, rank: int, up: bool) -> None: ...


class Injector:
    """Applies a run's kill and stall schedules to its worker processes on the fault clock that
    starts at ``clock_start`` (unix seconds)."""

    def __init__(self, schedules: list[dict[str, Any]], clock_start: float, record: FaultRecord):
        self.schedules = schedules
        self.clock_start = clock_start
        self.record = record
        self._applied = [0] * len(schedules)
        self._continue: list[tuple[float, Process]] = []   # (unix time, process) to SIGCONT
        self._links: list[tuple[float, dict[str, Any]]] = []   # (unix time, event) to bring up
        self.network: Network | None = None   # the emulated network of the group now

    def clock(self, now: float | None = None) -> float:
        """Seconds on the fault clock."""
        return (time.time() if now is None else now) - self.clock_start

    def apply(self, procs: Sequence[Process]) -> list[dict[str, Any]]:
        """Do what fell due; returns the new fault events (also saved in run.json)."""
        now = time.time()
        new: list[dict[str, Any]] = []
        for proc_due, proc in list(self._continue):
            if proc_due <= now:
                self._continue.remove((proc_due, proc))
                if proc.poll() is None:
                    _signal(proc.pid, signal.SIGCONT)
        for up_due, event in list(self._links):
            if up_due <= now:
                self._links.remove((up_due, event))
                self._set_link(event, True, now)
        for index, schedule in enumerate(self.schedules):
            moments = start_times(schedule, self.clock(now))
            for moment in moments[self._applied[index]:]:
                new.append(self._strike(schedule, moment, procs, now))
            self._applied[index] = len(moments)
        if new:
            self.record.events.extend(new)
            self.record.save()
        return new

    def _strike(self, schedule: dict[str, Any], moment: float, procs: Sequence[Process],
                now: float) -> dict[str, Any]:
        kind, rank = schedule["kind"], schedule["rank"]
        event: dict[str, Any] = {"kind": kind, "rank": rank, "at": round(moment, 3), "time": now,
                                 "schedule": schedule["text"]}
        if kind == SLOW:
            event["factor"] = schedule["factor"]
            event["for"] = schedule.get("for")
            return event
        proc = procs[rank] if rank < len(procs) else None
        if proc is None or proc.poll() is not None:
            event["missed"] = "the worker was not running (starting again, or ended)"
            return event
        if kind == LINK_DOWN:
            event["for"] = schedule["for"]
            if self._set_link(event, False, now):
                self._links.append((now + float(schedule["for"]), event))
        elif kind == KILL:
            _signal(proc.pid, signal.SIGKILL)
        else:
            _signal(proc.pid, signal.SIGSTOP)
            if schedule.get("for") is not None:
                event["for"] = schedule["for"]
                self._continue.append((now + float(schedule["for"]), proc))
        return event

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
        for _, event in self._links:
            event["down_s"] = round(time.time() - event["time"], 3)
        self._links.clear()


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass

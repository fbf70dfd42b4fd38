"""Processes named by (pid, start time), so that a recorded pid is never mistaken for another.

A run records the pids of its supervisor and workers. Once those processes are gone the kernel
hands the same numbers to new processes, so "is pid P alive?" can answer yes for an unrelated
program, and signalling P's process group would hit it. Linux gives every process a start time
(field 22 of ``/proc/PID/stat``, clock ticks after boot) that, together with the pid, names it
for as long as the machine runs: a recorded (pid, start time) whose start time differs from the
live process's is a different process, and counts as gone. Where ``/proc`` is missing (macOS)
the start time is unknown (None) and the pid alone is checked, as before.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Any


def start_ticks(pid: int) -> int | None:
    """The start time of live process ``pid`` in clock ticks after boot; None where unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the command in (...) may hold spaces
        return int(fields[19])  # field 22 of the whole line; fields[0] is field 3 (the state)
    except (OSError, IndexError, ValueError):
        return None


def process_state(pid: int) -> str | None:
    """The state letter of live process ``pid`` (R, S, T stopped, Z zombie, ...); None where
    unknown or gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


@dataclass(frozen=True)
class ProcessRef:
    """One process as recorded: its pid and, where known, its start time."""

    pid: int
    started: int | None = None

    @classmethod
    def of(cls, pid: int) -> ProcessRef:
        """The live process ``pid`` now (call it while the process is surely the one meant:
        right after starting it, or from the process itself)."""
        return cls(pid, start_ticks(pid))

    @classmethod
    def from_json(cls, value: Any) -> ProcessRef | None:
        """A recorded reference: ``[pid, started]``, or a bare pid from records before start
        times were kept; None for nothing recorded."""
        if isinstance(value, bool) or value is None:
            return None
        if isinstance(value, int):
            return cls(value) if value > 0 else None
        if isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[0], int) and value[0] > 0:
            started = value[1] if isinstance(value[1], int) and not isinstance(value[1], bool) else None
            return cls(value[0], started)
        return None

    def to_json(self) -> list[int | None]:
        return [self.pid, self.started]

    def alive(self) -> bool:
        """Whether this very process still runs: its pid exists, is not a zombie, and started
        when recorded (a reused pid is another process)."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # someone else's process: it exists
        if process_state(self.pid) == "Z":  # a zombie child of ours counts as gone
            return False
        return self.started is None or start_ticks(self.pid) in (None, self.started)

    def signal_group(self, sig: int) -> bool:
        """Send ``sig`` to the process group this process leads, if it is still this process;
        returns whether it was sent."""
        if not self.alive():
            return False
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def signal(self, sig: int = signal.SIGTERM) -> bool:
        """Send ``sig`` to this process, if it is still this process; returns whether it was sent."""
        if not self.alive():
            return False
        try:
            os.kill(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

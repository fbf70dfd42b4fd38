"""Per-step phase timing that does not change what it measures.

A step is cut into consecutive phases (data, forward, backward, communication, optimizer) by
calling :meth:`PhaseTimer.mark` at each boundary. On the CPU every operation is synchronous, so a
``perf_counter`` at each boundary is exact. On a GPU the host runs ahead of the device, so the
timer records a CUDA event at each boundary instead and reads the elapsed times only in
:meth:`collect`, once per logging interval, after the last event of the interval has completed:
no device synchronisation is added inside a step (docs/tasks.md, "What is timed").

A step captured in a CUDA graph carries its own timing events (recorded as graph nodes, which
needs ``external=True`` events); every replay re-records them, so :meth:`collect` reads the phases
of the interval's last step and scales them by the number of replays in the interval.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where events are made: `mlbench status` reads PHASES only
    import torch

PHASES = ("data", "forward", "backward", "communication", "optimizer")


class PhaseTimer:
    """Accumulates seconds per phase between :meth:`collect` calls."""

    def __init__(self, device: torch.device, enabled: bool = True):
        self.enabled = enabled
        self.cuda = enabled and device.type == "cuda"
        self._totals: dict[str, float] = defaultdict(float)
        self._last_cpu = 0.0
        self._pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self._last_event: torch.cuda.Event | None = None
        self._graph_marks: list[tuple[str, torch.cuda.Event]] = []
        self._capturing = False
        self._replays = 0

    @staticmethod
    def _event() -> torch.cuda.Event:
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def capture(self, active: bool) -> None:
        """Between capture(True) and capture(False), marks become timing nodes of a CUDA graph."""
        self._capturing = active and self.cuda
        if self._capturing:
            self._graph_marks = [("", self._graph_event())]

    @staticmethod
    def _graph_event() -> torch.cuda.Event:
        import torch

        event = torch.cuda.Event(enable_timing=True, external=True)
        event.record()
        return event

    def replayed(self) -> None:
        """A captured step ran once more."""
        self._replays += 1

    def begin(self) -> None:
        """Start of a step: the next :meth:`mark` measures from here."""
        if not self.enabled or self._graph_marks:
            return
        if self.cuda:
            self._last_event = self._event()
        else:
            self._last_cpu = time.perf_counter()

    def mark(self, phase: str) -> None:
        """End of ``phase`` (which began at the previous mark or :meth:`begin`)."""
        if not self.enabled:
            return
        if self._capturing:
            self._graph_marks.append((phase, self._graph_event()))
        elif self._graph_marks:
            return
        elif self.cuda:
            assert self._last_event is not None, "begin() starts a step before its first mark()"
            event = self._event()
            self._pending.append((phase, self._last_event, event))
            self._last_event = event
        else:
            now = time.perf_counter()
            self._totals[phase] += now - self._last_cpu
            self._last_cpu = now

    def collect(self) -> dict[str, float]:
        """Seconds per phase since the last call (waits for the GPU to reach the last mark)."""
        if self.cuda and self._pending:
            self._pending[-1][2].synchronize()
            for phase, start, end in self._pending:
                self._totals[phase] += start.elapsed_time(end) / 1000.0
            self._pending.clear()
        if self._graph_marks and self._replays:
            self._graph_marks[-1][1].synchronize()
            for (_, start), (phase, end) in zip(self._graph_marks, self._graph_marks[1:]):
                self._totals[phase] += start.elapsed_time(end) / 1000.0 * self._replays
            self._replays = 0
        totals = dict(self._totals)
        self._totals.clear()
        return totals

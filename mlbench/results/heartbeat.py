"""A worker's heartbeat: how far it got and whether it still answers, as one small file per rank.

Every worker rewrites ``RUN_DIR/heartbeats/rank-R.json`` about once a second from a thread of
its own (:mod:`mlbench.worker.heartbeat`), whatever its training loop does. What it says:

``time``
    when it was written (unix seconds): a file that stops being rewritten is a process that
    stopped answering (SIGSTOP, a frozen machine).
``started``, ``pid``, ``host``
    when the worker process began, its pid and its machine.
``step``, ``stepped_at``
    the last training step done and when (unix seconds; ``stepped_at`` is None before the first,
    and the end of an evaluation restarts it: the clock of the watchdog's bound).
``median_step_s``
    the median of its recent step times (None before two steps).
``phase``
    ``setup``, ``training``, ``evaluation``, ``finishing`` or ``done``.
``waiting``
    whether its main thread waits in a collective (torch.distributed) right now: a rank that
    makes no progress while *not* waiting is the one its peers wait for.
``where``
    where its main thread is (``file:line in function``), for the reason of a verdict.

The watchdog that reads them (:mod:`mlbench.results.watchdog`) decides whether a rank stalled.
The file is replaced by a rename, never written in place, so a reader sees a whole record or the
previous one; no fsync: a heartbeat lost in a power cut does not matter.

A pod cannot write into the run folder (it is read-only there): its worker posts the same record
to the results service (:mod:`mlbench.results.http_sink`), which stores it in the run's folder,
:func:`on_clock_of_receiver`, so that the watchdog beside it compares times of one clock.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

HEARTBEATS_DIR = "heartbeats"
PHASES = ("setup", "training", "evaluation", "finishing", "done")


@dataclass(frozen=True)
class Beat:
    """One heartbeat record (see the module for the fields)."""

    rank: int
    time: float
    started: float
    step: int = 0
    stepped_at: float | None = None
    median_step_s: float | None = None
    phase: str = "setup"
    waiting: bool = False
    where: str = ""
    pid: int = 0
    host: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Beat | None:
        """A record read back; None for anything that is not one (a damaged or foreign file)."""
        if not isinstance(data, dict):
            return None
        try:
            beat = cls(rank=int(data["rank"]), time=float(data["time"]), started=float(data["started"]),
                       step=int(data.get("step") or 0),
                       stepped_at=None if data.get("stepped_at") is None else float(data["stepped_at"]),
                       median_step_s=None if data.get("median_step_s") is None else float(data["median_step_s"]),
                       phase=str(data.get("phase") or "setup"), waiting=bool(data.get("waiting")),
                       where=str(data.get("where") or ""), pid=int(data.get("pid") or 0),
                       host=str(data.get("host") or ""))
        except (KeyError, TypeError, ValueError):
            return None
        return beat if beat.phase in PHASES else None


def on_clock_of_receiver(beat: Beat, received: float) -> Beat:
    """``beat`` with its times moved onto the clock of whoever received it at ``received`` (unix
    seconds): the worker's machine may be seconds off the watchdog's, which would read as
    seconds of progress or silence; the latency of the delivery (milliseconds) counts as silence."""
    shift = received - beat.time
    return replace(beat, time=received, started=beat.started + shift,
                   stepped_at=None if beat.stepped_at is None else beat.stepped_at + shift)


def heartbeat_path(run_dir: str | os.PathLike, rank: int) -> Path:
    return Path(run_dir) / HEARTBEATS_DIR / f"rank-{rank}.json"


def write_beat(run_dir: str | os.PathLike, beat: Beat) -> None:
    """Replace the rank's heartbeat file with ``beat`` (a temporary file renamed over it)."""
    path = heartbeat_path(run_dir, beat.rank)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
        json.dump(beat.to_json(), f)
    os.replace(tmp, path)


def read_beat(run_dir: str | os.PathLike, rank: int) -> Beat | None:
    """The rank's latest heartbeat, or None (none written yet, or unreadable)."""
    try:
        with open(heartbeat_path(run_dir, rank), encoding="utf-8") as f:
            return Beat.from_json(json.load(f))
    except (OSError, ValueError):
        return None


def read_beats(run_dir: str | os.PathLike, workers: int) -> dict[int, Beat | None]:
    """Every rank's latest heartbeat (None where there is none)."""
    return {rank: read_beat(run_dir, rank) for rank in range(workers)}

"""Metric events: one JSON object per line, append-only, one file per worker.

An event is ``{"time": unix seconds, "rank": r, "epoch": float, "step": int, "name": str,
"value": number | object}``. Each line is written and flushed on its own, so a crash (or a full
disk) loses at most the line being written, and a reader skips a torn last line. The same
records travel over HTTP to the results service on a cluster (ARCHITECTURE.md: "A run, as
data"); locally the sink is a file per rank.

Readers trust nothing about a line: one that is not JSON, or whose fields have the wrong types
(``"time": "x"``, a rank that is a bool, a null where a metric's number belongs), is skipped and
counted (:attr:`EventList.skipped`), so one damaged line never stops `status`, `download` or
`compare`.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Protocol
from collections.abc import Iterable, Iterator

EVENTS_DIR = "events"
#: names whose value is a number (phase seconds, training and evaluation metrics, bytes sent,
#: the system metrics of each interval)
NUMERIC_PREFIXES = ("time/", "train/", "eval/", "comm/", "sys/")
#: names whose value is an object
OBJECT_NAMES = ("result", "environment", "allreduce", "system")


class EventSink(Protocol):
    def write(self, event: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


class FileSink:
    """Appends events to ``RUN_DIR/events/rank-<r>.jsonl`` (flushed per line, mode 600: the run
    store is its user's alone)."""

    def __init__(self, run_dir: str | os.PathLike, rank: int):
        folder = Path(run_dir) / EVENTS_DIR
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = folder / f"rank-{rank}.jsonl"
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        self._file = open(descriptor, "a", encoding="utf-8")  # noqa: SIM115 - held until close()

    def write(self, event: dict[str, Any]) -> None:
        self._file.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class EventWriter:
    """What a worker calls to record metrics; stamps time and rank."""

    def __init__(self, sink: EventSink, rank: int):
        self.sink = sink
        self.rank = rank

    def emit(self, name: str, value: Any, *, epoch: float, step: int) -> None:
        self.sink.write({"time": time.time(), "rank": self.rank, "epoch": round(float(epoch), 6),
                         "step": int(step), "name": name, "value": value})

    def close(self) -> None:
        self.sink.close()


class EventList(list):
    """Events read from files, with the number of lines skipped as unreadable."""

    skipped: int = 0


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def event_problem(event: Any) -> str | None:
    """What is wrong with ``event`` as an event (see the module), or None when nothing is."""
    if not isinstance(event, dict):
        return "an event must be a JSON object"
    if not isinstance(event.get("name"), str):
        return "'name' must be a string"
    if not (_number(event.get("time")) and math.isfinite(event["time"])):
        return "'time' must be a finite number (unix seconds)"
    if not _integer(event.get("rank")):
        return "'rank' must be an integer"
    if not _number(event.get("epoch")):
        return "'epoch' must be a number"
    if not _integer(event.get("step")):
        return "'step' must be an integer"
    name, value = event["name"], event.get("value")
    if name.startswith(NUMERIC_PREFIXES) and not _number(value):
        return f"the 'value' of {name} must be a number"
    if name in OBJECT_NAMES and not isinstance(value, dict):
        return f"the 'value' of {name} must be an object"
    return None


def valid_event(event: Any) -> bool:
    return event_problem(event) is None


def parse_lines(lines: Iterable[str], skipped: EventList | None = None) -> Iterator[dict[str, Any]]:
    """Events from JSON lines; a line that is not an event is skipped and counted in ``skipped``."""
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if valid_event(event):
            yield event
        elif skipped is not None:
            skipped.skipped += 1


def read_rank_events(path: str | os.PathLike) -> EventList:
    """The events of one file; a last line without its newline is still being written: left out."""
    events = EventList()
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except FileNotFoundError:
        return events
    events.extend(parse_lines(text[:text.rfind("\n") + 1].splitlines(), events))
    return events


def events_path(run_dir: str | os.PathLike, rank: int) -> Path:
    """Worker ``rank``'s event file (JSON lines)."""
    return Path(run_dir) / EVENTS_DIR / f"rank-{rank}.jsonl"


def read_run_events(run_dir: str | os.PathLike) -> EventList:
    """All events of a run, every rank, ordered by time."""
    folder = Path(run_dir) / EVENTS_DIR
    events = EventList()
    for path in sorted(folder.glob("rank-*.jsonl")):
        rank_events = read_rank_events(path)
        events.extend(rank_events)
        events.skipped += rank_events.skipped
    events.sort(key=lambda e: (e["time"], e["rank"]))
    return events


def read_events_from(path: str | os.PathLike, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The events of the whole lines written after byte ``offset`` of one file, and the offset
    after the last whole line: where the next read starts, so a reader (the dashboard's API and
    live stream) sees every event once, and a line being written only when it is complete."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except FileNotFoundError:
        return [], offset
    end = chunk.rfind(b"\n") + 1
    return list(parse_lines(chunk[:end].decode("utf-8", errors="replace").split("\n"))), offset + end


class EventTail:
    """Reads the events appended to one file since the last call (for live progress), from byte
    ``offset`` on (a resumed run's follower starts where its resume found the file)."""

    def __init__(self, path: str | os.PathLike, offset: int = 0):
        self.path = Path(path)
        self._offset = offset
        self._partial = ""

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                f.seek(self._offset)
                chunk = f.read()
                self._offset = f.tell()
        except FileNotFoundError:
            return []
        text = self._partial + chunk
        lines = text.split("\n")
        self._partial = lines.pop()
        return list(parse_lines(lines))

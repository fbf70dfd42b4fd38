"""Metric events: one JSON object per line, append-only, one file per worker.

An event is ``{"time": unix seconds, "rank": r, "epoch": float, "step": int, "name": str,
"value": number | object}``. Each line is written and flushed on its own, so a crash (or a full
disk) loses at most the line being written, and a reader skips a torn last line. The same
records travel over HTTP to the results service on a cluster (ARCHITECTURE.md, "A run, as
data"); locally the sink is a file per rank.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Protocol

EVENTS_DIR = "events"


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
        self._file = open(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "a",
                          encoding="utf-8")

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


def parse_lines(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """Events from JSON lines; a torn or corrupt line (a crash mid-write) is skipped."""
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and "name" in event:
            yield event


def read_rank_events(path: str | os.PathLike) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return list(parse_lines(f))
    except FileNotFoundError:
        return []


def read_run_events(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """All events of a run, every rank, ordered by time."""
    folder = Path(run_dir) / EVENTS_DIR
    events: list[dict[str, Any]] = []
    for path in sorted(folder.glob("rank-*.jsonl")):
        events.extend(read_rank_events(path))
    events.sort(key=lambda e: (e.get("time", 0), e.get("rank", 0)))
    return events


class EventTail:
    """Reads the events appended to one file since the last call (for live progress)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._offset = 0
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

"""Storing the events workers post, each exactly once, across retries and restarts.

Events land in the same files a local run writes (``runs/<id>/events/rank-<r>.jsonl``), so
everything that reads a run folder (status, summaries, download) works unchanged; the readers
order events by time, so the file itself need not be in sequence order. Each event carries the
sender's per-rank sequence number ``seq``; the log remembers, per (run, rank), which numbers it
has stored (as ranges, :class:`SeqRanges`) and skips those, so a batch sent twice (the answer to
the first try was lost) is stored once, and a batch that overtakes an earlier one (several
connections, a retry) is stored, not dropped: the earlier batch is still welcome when it comes.
A batch is written, flushed and fsync'ed before it is acknowledged, so an acknowledged event
survives a crash of the service; the stored numbers are recovered from the file itself after a
restart, and a line torn by a crash mid-write is cut off before anything is appended after it.
"""

from __future__ import annotations

import bisect
import json
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mlbench.results.events import EVENTS_DIR, parse_lines


class SeqRanges:
    """A set of sequence numbers kept as sorted, disjoint, non-adjacent ranges [start, end).

    A rank's numbers arrive in runs (batches of consecutive numbers), so a handful of ranges
    holds a whole run's worth: a gap the sender left for good (the oldest events it dropped in
    a long outage) costs one range, where a set of numbers would grow with every event.
    """

    def __init__(self, numbers: Iterable[int] = ()) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        for number in sorted(set(numbers)):
            self.add(number)

    def __contains__(self, number: int) -> bool:
        i = bisect.bisect_right(self.starts, number) - 1
        return i >= 0 and number < self.ends[i]

    def add(self, number: int) -> None:
        if number in self:
            return
        i = bisect.bisect_right(self.starts, number)  # the range after number, if any
        joins_before = i > 0 and self.ends[i - 1] == number
        joins_after = i < len(self.starts) and self.starts[i] == number + 1
        if joins_before and joins_after:
            self.ends[i - 1] = self.ends.pop(i)
            del self.starts[i]
        elif joins_before:
            self.ends[i - 1] = number + 1
        elif joins_after:
            self.starts[i] = number
        else:
            self.starts.insert(i, number)
            self.ends.insert(i, number + 1)

    def first_missing(self) -> int:
        """The lowest number not in the set: everything below it is stored."""
        return self.ends[0] if self.starts and self.starts[0] == 0 else 0


class EventLog:
    """Appends deduplicated events to the per-rank files of the runs under ``runs_dir``."""

    def __init__(self, runs_dir: Path):
        self.runs_dir = Path(runs_dir)
        self._stored: dict[tuple[str, int], SeqRanges] = {}
        self._locks: dict[tuple[str, int], threading.Lock] = {}
        self._guard = threading.Lock()

    def path(self, run_id: str, rank: int) -> Path:
        return self.runs_dir / run_id / EVENTS_DIR / f"rank-{rank}.jsonl"

    def _lock(self, key: tuple[str, int]) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def _recover(self, path: Path) -> SeqRanges:
        """Cut a torn last line off ``path``; the sequence numbers of the events it holds."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return SeqRanges()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            with open(path, "r+b") as f:
                f.truncate(end)
                os.fsync(f.fileno())
        events = list(parse_lines(data[:end].decode("utf-8", errors="replace").splitlines()))
        seqs = [e["seq"] for e in events if isinstance(e.get("seq"), int)]
        return SeqRanges(seqs if seqs else range(len(events)))

    def append(self, run_id: str, rank: int, events: list[dict[str, Any]]) -> int:
        """Store the events not stored yet, whatever their order; return the lowest sequence
        number of the rank not stored yet (all below it are)."""
        key = (run_id, rank)
        path = self.path(run_id, rank)
        with self._lock(key):
            if key not in self._stored:
                self._stored[key] = self._recover(path)
            stored = self._stored[key]
            fresh: dict[int, dict[str, Any]] = {}
            for event in events:
                if event["seq"] not in stored:
                    fresh.setdefault(event["seq"], event)
            if fresh:
                lines = "".join(json.dumps(fresh[s], separators=(",", ":")) + "\n" for s in sorted(fresh))
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)  # private, no link
                with open(fd, "a", encoding="utf-8") as f:
                    f.write(lines)
                    f.flush()
                    os.fsync(f.fileno())
                for seq in fresh:
                    stored.add(seq)
            return stored.first_missing()

    def forget(self, run_id: str) -> None:
        """Drop what is remembered of a deleted run."""
        with self._guard:
            for key in [k for k in self._stored if k[0] == run_id]:
                del self._stored[key]

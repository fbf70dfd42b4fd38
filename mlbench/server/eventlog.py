"""Storing the events workers post, each exactly once, across retries and restarts.

Events land in the same files a local run writes (``runs/<id>/events/rank-<r>.jsonl``), so
everything that reads a run folder (status, summaries, download) works unchanged. Each event
carries the sender's per-rank sequence number ``seq``; the log remembers, per (run, rank), the
next number it expects and skips anything below it, so a batch sent twice (the answer to the
first try was lost) is stored once. A batch is written, flushed and fsync'ed before it is
acknowledged, so an acknowledged event survives a crash of the service; the expected number is
recovered from the file itself after a restart, and a line torn by a crash mid-write is cut off
before anything is appended after it.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from mlbench.results.events import EVENTS_DIR, parse_lines


class EventLog:
    """Appends deduplicated events to the per-rank files of the runs under ``runs_dir``."""

    def __init__(self, runs_dir: Path):
        self.runs_dir = Path(runs_dir)
        self._next: dict[tuple[str, int], int] = {}
        self._locks: dict[tuple[str, int], threading.Lock] = {}
        self._guard = threading.Lock()

    def path(self, run_id: str, rank: int) -> Path:
        return self.runs_dir / run_id / EVENTS_DIR / f"rank-{rank}.jsonl"

    def _lock(self, key: tuple[str, int]) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def _recover(self, path: Path) -> int:
        """Cut a torn last line off ``path``; the sequence number that follows its last event."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return 0
        end = data.rfind(b"\n") + 1
        if end < len(data):
            with open(path, "r+b") as f:
                f.truncate(end)
                os.fsync(f.fileno())
        events = list(parse_lines(data[:end].decode("utf-8", errors="replace").splitlines()))
        seqs = [e["seq"] for e in events if isinstance(e.get("seq"), int)]
        return max(seqs) + 1 if seqs else len(events)

    def append(self, run_id: str, rank: int, events: list[dict[str, Any]]) -> int:
        """Store the events not stored yet; return the next sequence number expected."""
        key = (run_id, rank)
        path = self.path(run_id, rank)
        with self._lock(key):
            if key not in self._next:
                self._next[key] = self._recover(path)
            expected = self._next[key]
            fresh: dict[int, dict[str, Any]] = {}
            for event in events:
                if event["seq"] >= expected:
                    fresh.setdefault(event["seq"], event)
            if fresh:
                lines = "".join(json.dumps(fresh[s], separators=(",", ":")) + "\n" for s in sorted(fresh))
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)  # private, no link
                with open(fd, "a", encoding="utf-8") as f:
                    f.write(lines)
                    f.flush()
                    os.fsync(f.fileno())
                self._next[key] = max(fresh) + 1
            return self._next[key]

    def forget(self, run_id: str) -> None:
        """Drop what is remembered of a deleted run."""
        with self._guard:
            for key in [k for k in self._next if k[0] == run_id]:
                del self._next[key]

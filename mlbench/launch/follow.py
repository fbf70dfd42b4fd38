"""Following a run from any process: its progress events and its workers' logs as they are
written, until the run ends.

`mlbench status RUN --follow` and `mlbench logs RUN --follow` work on runs started with
``--detach``, from another terminal, or on a cluster alike: every poll asks the launcher for the
run's true state (for a cluster run this also copies the new lines of its folder from the
results service), then reads what was appended since the last poll. The state is read *before*
the files, so once a run is seen ended, the read that follows holds everything it wrote.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

from mlbench.errors import MlbenchError, UsageError
from mlbench.launch.base import EventCallback, Launcher
from mlbench.results.events import EVENTS_DIR, EventTail
from mlbench.results.store import RunRecord

LOGS_DIR = "logs"


def log_path(record: RunRecord, rank: int) -> Path:
    """Where worker ``rank``'s output is kept: written there by a local worker, saved there by a
    cluster's supervisor when the worker's pod ends."""
    return record.run_dir / LOGS_DIR / f"rank-{rank}.log"


def check_rank(record: RunRecord, rank: int) -> None:
    if not 0 <= rank < record.workers:
        raise UsageError(f"--rank {rank}: run {record.id} has workers 0..{record.workers - 1}")


def _refresh(launcher: Launcher, record: RunRecord) -> RunRecord:
    return launcher.reconcile(launcher.store.get(record.id))


def follow_events(launcher: Launcher, record: RunRecord, on_event: EventCallback,
                  sleep: Callable[[float], None] = time.sleep) -> RunRecord:
    """Pass rank 0's events to ``on_event``, those recorded so far and then new ones as they
    arrive, until the run has ended; returns its final record."""
    tail = EventTail(record.run_dir / EVENTS_DIR / "rank-0.jsonl")
    while True:
        ended = not record.active
        for event in tail.read_new():
            on_event(event)
        if ended:
            return record
        sleep(launcher.follow_seconds)
        record = _refresh(launcher, record)


def follow_file(launcher: Launcher, record: RunRecord, path: Path, follow: bool,
                sleep: Callable[[float], None] = time.sleep) -> Iterator[str]:
    """The lines of a run's file (without their newline); with ``follow``, new lines as they
    are written until the run has ended. A missing file is an error unless followed (a run that
    has not started yet)."""
    if not follow and not path.exists():
        raise MlbenchError(f"run {record.id} has no {path.name} ({record.state}); "
                           f"`mlbench status {record.id}` says why")
    offset, partial = 0, b""
    while True:
        ended = not follow or not record.active
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
                offset = f.tell()
        except FileNotFoundError:
            chunk = b""
        *lines, partial = (partial + chunk).split(b"\n")
        for line in lines:
            yield line.decode(errors="replace")
        if ended:
            if partial:
                yield partial.decode(errors="replace")
            return
        sleep(launcher.follow_seconds)
        record = _refresh(launcher, record)

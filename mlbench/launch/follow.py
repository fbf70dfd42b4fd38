"""Reading a run's growing file (a worker's log) until the run ends.

`mlbench logs RUN --follow` works on runs started with ``--detach``, from another terminal, or on
a cluster alike: every poll asks the launcher for the run's true state (for a cluster run this
also copies the new lines of its folder from the results service), then reads what was appended
since the last poll. The state is read *before* the file, so once a run is seen ended, the read
that follows holds everything it wrote. (Rank 0's events are followed by
:meth:`mlbench.launch.base.Launcher.follow`.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

from mlbench.errors import MlbenchError, UsageError
from mlbench.results.store import RunRecord


def check_rank(record: RunRecord, rank: int) -> None:
    if not 0 <= rank < record.workers:
        raise UsageError(f"--rank {rank}: run {record.id} has workers 0..{record.workers - 1}")


def follow_file(record: RunRecord, path: Path, follow: bool, refresh: Callable[[RunRecord], RunRecord],
                interval: float, sleep: Callable[[float], None] = time.sleep) -> Iterator[str]:
    """The lines of a run's file (without their newline); with ``follow``, new lines as they
    are written until the run has ended (``refresh`` says how the run is, every ``interval``
    seconds). A missing file is an error unless followed (a run that has not started yet)."""
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
        sleep(interval)
        record = refresh(record)

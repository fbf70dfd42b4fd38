"""How a worker of any framework records its end when it fails: its error event (best effort) and
the exit a peers' watchdog verdict forces. Shared by the PyTorch worker (``mlbench.worker``) and the
ports (:mod:`mlbench.worker.port_trainer`)."""

from __future__ import annotations

import os
import sys

from mlbench.results.events import EventWriter


def stalled_peer(events: EventWriter, reason: str, record: bool) -> None:
    """The peers' watchdog found a stalled rank (workers without a supervisor): the first rank
    not blamed records the reason as its error; every one not blamed exits with 1 at once (its
    main thread may wait in a collective that never returns), so the launcher ends the rest."""
    message = f"watchdog: {reason}"
    if record:
        record_error(events, message)
    print(f"Error: {message}", file=sys.stderr, flush=True)
    try:
        events.close()
    except Exception:  # exiting regardless; the log has the reason
        pass
    os._exit(1)


def record_error(events: EventWriter, message: str) -> None:
    """Best effort: the error event may itself fail (a full disk); the log still has it."""
    try:
        events.emit("error", message, epoch=0, step=0)
    except OSError as err:
        print(f"could not record the error event: {err}", file=sys.stderr)

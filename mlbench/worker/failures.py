"""How a worker of any framework records its end when it fails: its error event (best effort), the
class of its failure, and the exit a peers' watchdog verdict forces. Shared by the PyTorch worker
(``mlbench.worker``) and the ports (:mod:`mlbench.worker.port_trainer`).

Failure classes, as Kubernetes' pod failure policy has them: a failure that no restart can mend
(no space left, a read-only file system, a usage or data error, a plug-in's error, a checkpoint
that cannot be read, a divergence, which an exact resume repeats) is *permanent*: the worker exits
with :data:`PERMANENT_EXIT` and, where it can still write, records why (``error/permanent``), and
every supervisor ends the run at once with that reason instead of restarting it
(:meth:`mlbench.launch.recovery.Recovery.failure`). Anything else (a killed or stalled peer, a lost
link, an error of torch's collectives) is transient: a restart may mend it.
"""

from __future__ import annotations

import errno
import os
import sys
import traceback
from collections.abc import Iterator

from mlbench.errors import DataError, DivergedError, MlbenchError, UsageError
from mlbench.results.events import EventWriter

#: The exit code of a worker whose failure no restart can mend (0 done, 1 failed, 2 usage, 143 stopped).
PERMANENT_EXIT = 4
#: The event, right after the ``error`` event, that says why no restart can mend it.
PERMANENT_EVENT = "error/permanent"
_NO_SPACE = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "the disk quota is exceeded",
             errno.EROFS: "the file system is read-only"}


def stalled_peer(events: EventWriter, reason: str, record: bool) -> None:
    """The peers' watchdog found a stalled rank (workers without a supervisor): the first rank
    not blamed records the reason as its error; every one not blamed exits with 1 at once (its
    main thread may wait in a collective that never returns), so the launcher ends the rest."""
    message = f"watchdog: {reason}"
    if record:
        record_error(events, message)
    say(f"Error: {message}")
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
        say(f"could not record the error event: {err}")


def say(text: str) -> None:
    """A line on the worker's standard error (its log), best effort: on a full disk the log
    cannot take it, and the failure must still end with its own exit code."""
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _causes(err: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__  # type: ignore[assignment]


def permanent_cause(err: BaseException) -> str | None:
    """Why no restart can mend ``err`` (its class, in words), or None when one may."""
    from mlbench.plugins import PluginError
    from mlbench.worker.checkpoint import CheckpointError

    for cause in _causes(err):
        if isinstance(cause, OSError) and cause.errno in _NO_SPACE:
            return _NO_SPACE[cause.errno]
        if isinstance(cause, RuntimeError) and "file write failed" in str(cause):
            return "a file could not be written (torch's writer failed: most often no space left)"
        for kind, words in ((UsageError, "a usage error"), (DataError, "an error in the data"),
                            (PluginError, "a plug-in's error"), (CheckpointError, "a checkpoint that cannot be used"),
                            (DivergedError, "a divergence, which a resume from a checkpoint repeats exactly")):
            if isinstance(cause, kind):
                return words
    return None


def record_failure(events: EventWriter, message: str, err: BaseException) -> int:
    """Record a worker's failure (its ``error`` event, and ``error/permanent`` with the class of
    one that no restart can mend; best effort both) and return its exit code: 1, or
    :data:`PERMANENT_EXIT`."""
    record_error(events, message)
    cause = permanent_cause(err)
    if cause is None:
        return 1
    try:
        events.emit(PERMANENT_EVENT, cause, epoch=0, step=0)
    except OSError:
        pass  # the exit code still says it
    return PERMANENT_EXIT


def worker_failed(events: EventWriter, err: BaseException) -> int:
    """A worker's training ended with ``err`` (any framework's worker: the PyTorch one and the
    ports): record it (:func:`record_failure`), say it in the log (mlbench's own errors in their
    one line, anything else with its traceback), and return the exit code."""
    if isinstance(err, MlbenchError):
        code = record_failure(events, str(err), err)
        say(f"Error: {err}")
    else:
        code = record_failure(events, f"{type(err).__name__}: {err}".splitlines()[0][:500], err)
        say("".join(traceback.format_exception(err)).rstrip())
    return code

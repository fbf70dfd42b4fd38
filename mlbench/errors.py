"""Errors a user can act on.

Everything the library raises on purpose derives from :class:`MlbenchError`; its message is one
sentence that says what is wrong and what to do. The CLI prints it as one line (exit code 1), or
exit code 2 for :class:`UsageError`, and never shows a traceback for these.
"""

from __future__ import annotations


class MlbenchError(Exception):
    """A failure the user can understand and fix; the message is shown as is. ``option``: the
    `mlbench run` option it concerns (its API name), where one does, so that a form can show it
    beside that field (:func:`about_option`)."""

    exit_code = 1
    option: str | None = None

    def __init__(self, *args: object, option: str | None = None) -> None:
        super().__init__(*args)
        if option is not None:
            self.option = option


class UsageError(MlbenchError):
    """Wrong arguments or options (exit code 2, like click's own usage errors)."""

    exit_code = 2


def about_option(err: MlbenchError, option: str) -> MlbenchError:
    """``err``, said to concern ``option`` unless it already names a more precise one (an
    optimizer's own option within ``optimizer_options``)."""
    if err.option is None:
        err.option = option
    return err


class DataError(MlbenchError):
    """A data set is missing, unreadable or corrupt."""


class DivergedError(MlbenchError):
    """Training produced a non-finite loss or non-finite parameters: the run failed."""


class RunNotFound(UsageError):
    """No run matches the id or name the user gave."""


class ClusterError(MlbenchError):
    """A cluster could not be created, reached or deleted."""


def peer_consequence(message: str) -> int:
    """How surely a worker's error ``message`` only follows from another rank's failure: 2 a
    peer's closed or reset connection (gloo says so in several ways), 1 a timeout waiting for a
    peer, 0 a rank's own error. Who is blamed for a failed run is the rank with the lowest."""
    text = message.lower()
    if any(words in text for words in ("connection closed by peer", "connection reset by peer",
                                       "caused by a remote worker crashing")):
        return 2
    return 1 if "timed out" in text or "timeout" in text else 0

"""Errors a user can act on.

Everything the library raises on purpose derives from :class:`MlbenchError`; its message is one
sentence that says what is wrong and what to do. The CLI prints it as one line (exit code 1), or
exit code 2 for :class:`UsageError`, and never shows a traceback for these.
"""


class MlbenchError(Exception):
    """A failure the user can understand and fix; the message is shown as is."""

    exit_code = 1


class UsageError(MlbenchError):
    """Wrong arguments or options (exit code 2, like click's own usage errors)."""

    exit_code = 2


class DataError(MlbenchError):
    """A data set is missing, unreadable or corrupt."""


class DivergedError(MlbenchError):
    """Training produced a non-finite loss or non-finite parameters: the run failed."""


class RunNotFound(UsageError):
    """No run matches the id or name the user gave."""


class ClusterError(MlbenchError):
    """A cluster could not be created, reached or deleted."""

"""The interface every launcher implements: how a run's workers are started and followed.

A launcher owns one run store (this machine's, or a cluster's mirror) and answers five requests:
record a new run (:meth:`Launcher.create`, which validates everything that can be validated
before anything exists), run it in the foreground while reporting its events, start it in the
background, cancel it, and tell its true state (:meth:`Launcher.reconcile`: a run whose
processes or pods vanished is marked as such the next time anything looks). :meth:`Launcher.logs`
reads a worker's output from the run folder unless a launcher knows better (a running pod's log
comes from the cluster). ``local`` (processes here), ``kubernetes`` (pods on the current
cluster) and ``slurm`` (a batch job) implement it; a new one is one module plus its registration
in :mod:`mlbench.launch.session`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any

from mlbench.launch.plan import RunRequest
from mlbench.results.store import RunRecord, RunStore

#: Called with each of rank 0's metric events while a run is followed in the foreground.
EventCallback = Callable[[dict[str, Any]], None]


class Launcher(ABC):
    """Starts and follows the runs of one store."""

    name: str = ""
    #: Seconds between two looks at a followed run (`status --follow`, `logs --follow`).
    follow_seconds: float = 0.5

    def __init__(self, store: RunStore):
        self.store = store

    def check_workers(self, workers: int) -> None:  # noqa: B027 - optional hook, a no-op unless overridden
        """Refuse (UsageError) a worker count this launcher cannot start; by default any count
        goes (a cluster's scheduler or Slurm's controller says why it cannot place the run)."""

    @abstractmethod
    def create(self, request: RunRequest) -> RunRecord:
        """Validate ``request`` for this launcher and record a pending run (nothing started)."""

    @abstractmethod
    def run_attached(self, record: RunRecord, on_event: EventCallback | None = None) -> RunRecord:
        """Start the run and follow it to its end; Ctrl-C cancels it. Returns the final record."""

    @abstractmethod
    def start_detached(self, record: RunRecord) -> None:
        """Start the run in the background and return at once."""

    @abstractmethod
    def cancel(self, record: RunRecord) -> RunRecord:
        """End an active run as cancelled; what it recorded is kept."""

    @abstractmethod
    def reconcile(self, record: RunRecord) -> RunRecord:
        """The run's true state now (a run whose workers vanished is marked failed)."""

    def logs(self, record: RunRecord, rank: int, follow: bool = False) -> Iterator[str]:
        """The output of worker ``rank``, line by line; with ``follow``, new lines as they are
        written, until the run ends. By default from ``RUN_DIR/logs/rank-R.log``, where local
        workers write and a cluster's supervisor keeps the logs of ended pods."""
        from mlbench.launch.follow import check_rank, follow_file, log_path

        check_rank(record, rank)
        return follow_file(self, record, log_path(record, rank), follow)

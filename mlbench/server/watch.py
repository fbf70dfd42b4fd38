"""The watchdog of the runs whose heartbeats the results service receives and nobody else judges.

Workers started by torchrun, srun or mpirun without a shared run folder post their events and
heartbeats to `mlbench serve` (``MLBENCH_RESULTS_URL``): they cannot read each other's
heartbeats, as workers on a shared folder do, and no supervisor owns their processes, as the
local launcher's and the pod supervisor's do. The service holds every rank's heartbeat (stored in
the run's folder on its own clock), so it is where the judgement can be made: this thread asks
:func:`mlbench.results.watchdog.judge` about each such run about once a second and, on a verdict,
ends the run ``failed`` with the verdict's reason, naming the stalled rank, as the pod supervisor
does for pods. It cannot stop processes that the user's launcher owns: the service tells the
workers in its answer to their next heartbeat (:meth:`HeartbeatWatch.verdict`), and those not
blamed exit with code 1, so that torchrun or ``srun --kill-on-bad-exit`` ends the rest, as on a
shared folder (:mod:`mlbench.worker.heartbeat`).

Which runs: those with a heartbeat received since this service started, unless its pod
supervisor judges them (Kubernetes runs). Its clock starts with the run's first heartbeat
received, and heartbeats stored before the service started say nothing of now (it was down).
A run whose workers already recorded how it ended (a result, an error) is left to that record.
"""

from __future__ import annotations

import sys
import threading
import time

from mlbench.errors import RunNotFound
from mlbench.launch.run_folder import read_outcome
from mlbench.results import watchdog
from mlbench.results.heartbeat import read_beats
from mlbench.results.store import FAILED, RunStore
from mlbench.results.watchdog import Stall
from mlbench.run_config import RunDocument

#: Seconds between two judgements (far below the watchdog's shortest bound, 5 s).
INTERVAL_S = 1.0


class HeartbeatWatch:
    """Judges the heartbeats of the runs :meth:`received` was told of, every ``interval`` seconds."""

    def __init__(self, store: RunStore, interval: float = INTERVAL_S):
        self.store = store
        self.interval = interval
        self.started = time.time()
        self._first: dict[str, float] = {}       # run id -> its first heartbeat received here
        self._verdicts: dict[str, Stall] = {}    # runs this watch failed, for their workers
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def received(self, run_id: str, now: float) -> None:
        """A heartbeat of run ``run_id`` was stored at ``now``: the run is watched from then on."""
        with self._lock:
            self._first.setdefault(run_id, now)

    def verdict(self, run_id: str) -> Stall | None:
        """The verdict that failed run ``run_id``, if this watch failed it (for its workers)."""
        with self._lock:
            return self._verdicts.get(run_id)

    def start(self) -> HeartbeatWatch:
        self._thread = threading.Thread(target=self._loop, name="heartbeat-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check_once()
            except Exception as err:  # the next round tries again; the service goes on
                print(f"heartbeat watch: {type(err).__name__}: {str(err)[:300]}", file=sys.stderr, flush=True)

    def check_once(self, now: float | None = None) -> None:
        """One round: judge every watched run; fail those with a stalled rank."""
        now = time.time() if now is None else now
        with self._lock:
            watched = dict(self._first)
        for run_id, first in watched.items():
            stall = self.judge(run_id, first, now)
            if stall is not None:
                self._fail(run_id, stall)

    def judge(self, run_id: str, first: float, now: float) -> Stall | None:
        """The watchdog's verdict on one watched run now (None: no rank stalled); a run that
        ended, or has no watchdog, is no longer watched."""
        try:
            run = self.store.get(run_id)
        except RunNotFound:
            run = None
        document = RunDocument.load_or_none(run.run_dir) if run is not None and run.active else None
        if run is None or document is None or not document.config.watchdog_s:
            self._forget(run_id)
            return None
        beats = {rank: beat if beat is not None and beat.time >= self.started else None
                 for rank, beat in read_beats(run.run_dir, run.workers).items()}
        stall = watchdog.judge(beats, now, document.config.watchdog_s, max(first, self.started))
        if stall is not None:
            outcome = read_outcome(run.run_dir)
            if outcome.result is not None or outcome.error is not None:
                self._forget(run_id)  # the workers said how it ended; `status` records that
                return None
        return stall

    def forget(self, run_id: str) -> None:
        """Drop all that is kept of a deleted run."""
        with self._lock:
            self._first.pop(run_id, None)
            self._verdicts.pop(run_id, None)

    def _fail(self, run_id: str, stall: Stall) -> None:
        if self.store.mark_ended(run_id, FAILED, reason=stall.reason):  # not when it ended meanwhile
            with self._lock:
                self._verdicts[run_id] = stall
        self._forget(run_id)

    def _forget(self, run_id: str) -> None:
        """Stop watching a run (what was decided about it is kept for its workers)."""
        with self._lock:
            self._first.pop(run_id, None)

"""The worker's heartbeat thread: its progress, rewritten about once a second, and, where no
supervisor owns the workers, the watchdog over its peers.

The training loop only updates a few fields (:meth:`Heartbeat.stepped`, :meth:`Heartbeat.phase`);
a daemon thread writes them (:mod:`mlbench.results.heartbeat`) together with whether the main
thread waits in a collective right now: into the run folder, or, in a pod (whose run folder is
read-only), to the results service that stores it there (:func:`mlbench.results.http_sink.beat_sender`).
That thread runs while the main thread waits in gloo's C++ (which releases the GIL), so a rank
blocked on a stalled peer keeps beating, and a stopped process (SIGSTOP) stops beating: the
watchdog (:mod:`mlbench.results.watchdog`) tells the victims from the culprit.

A local run's supervisor and a cluster's (the pod supervisor of `mlbench serve`) watch the
heartbeats themselves and kill the workers of a stalled run. Workers that no mlbench process
owns (started by torchrun, srun or mpirun on a shared run folder, ``watch_peers``) judge their
peers instead: on a verdict the lowest rank not blamed records the reason as its error, and
every rank not blamed exits with code 1, so that the user's launcher (srun --kill-on-bad-exit,
torchrun) ends the rest. Such workers without a shared run folder post their heartbeats to the
results service, whose own watchdog (:mod:`mlbench.server.watch`) judges them and answers a
heartbeat with its verdict: the ranks not blamed then exit with code 1 alike.
"""

from __future__ import annotations

import functools
import linecache
import os
import socket
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from mlbench.results.heartbeat import Beat, read_beats, write_beat
from mlbench.results.watchdog import Stall, judge

#: Where a heartbeat goes; an OSError from it ends the heartbeats (the sender gave up for good).
#: It may answer with the verdict of a watchdog beyond it (the results service's).
BeatSender = Callable[[Beat], "Stall | None"]

#: Seconds between two heartbeats.
INTERVAL_S = 1.0
#: Set (to 1) in the environment of workers whose processes a supervisor owns and watches.
SUPERVISED_ENV = "MLBENCH_SUPERVISED"
#: Step times the median is taken over.
STEP_WINDOW = 101
_DISTRIBUTED = os.path.join("torch", "distributed")


def main_thread_state(thread_id: int) -> tuple[bool, str]:
    """Whether thread ``thread_id`` waits in a collective now, and where it is ("file:line in
    function", the innermost frame outside torch). Waiting: its innermost Python frame is
    torch.distributed's (a collective blocks in C++ below it), or that frame's line waits on a
    request (``work.wait()``). Only the innermost frame counts: code that runs *above* a
    collective's Python frame (a signal handler that never returns) is not waiting.
    A heuristic that only chooses whom to blame, never whether a run stalled."""
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return False, ""
    stack: list[FrameType] = []
    inner: FrameType | None = frame
    while inner is not None:
        stack.append(inner)
        inner = inner.f_back
    waiting = _DISTRIBUTED in frame.f_code.co_filename or \
        ".wait(" in linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    own = [f for f in stack if f"{os.sep}torch{os.sep}" not in f.f_code.co_filename]
    where = f"{Path(own[0].f_code.co_filename).name}:{own[0].f_lineno} in {own[0].f_code.co_name}" if own else ""
    return waiting, where


class Heartbeat:
    """The heartbeat of worker ``rank``, written into ``run_dir`` (or given to ``send``) from a
    thread of its own."""

    def __init__(self, run_dir: Path, rank: int, workers: int, *, interval: float = INTERVAL_S,
                 watchdog_s: float | None = None, watch_peers: bool = False,
                 on_stall: Callable[[str, bool], None] | None = None, send: BeatSender | None = None):
        self.run_dir = run_dir
        self.send: BeatSender = send or functools.partial(write_beat, run_dir)
        self.rank = rank
        self.workers = workers
        self.interval = interval
        self.watchdog_s = watchdog_s
        self.watch_peers = watch_peers and bool(watchdog_s) and workers > 1
        self.on_stall = on_stall
        self.started = time.time()
        self.host = socket.gethostname()
        self.step = 0
        self.stepped_at: float | None = None
        self._phase = "setup"
        self._durations: deque[float] = deque(maxlen=STEP_WINDOW)
        self._previous: float | None = None   # the last step's end, while steps follow each other
        self._main = threading.get_ident()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._broken = False

    def start(self) -> Heartbeat:
        self.beat()
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
        self._thread.start()
        return self

    def stepped(self, step: int, steps: int = 1) -> None:
        """The main thread finished training step ``step`` (cheap: called on every step), or a
        run of ``steps`` steps ending with it in one call (each counted as the run's mean)."""
        now = time.time()
        if self._previous is not None:
            self._durations.extend([(now - self._previous) / steps] * steps)
        self._previous = self.stepped_at = now
        self.step = step
        self._phase = "training"

    def phase(self, name: str) -> None:
        """The main thread enters phase ``name`` (see :data:`mlbench.results.heartbeat.PHASES`);
        the time until the next step is no step time."""
        if name == "training" and self.step:
            self.stepped_at = time.time()  # back from an evaluation: the progress clock restarts
        self._phase = name
        self._previous = None

    def stop(self) -> None:
        """The worker is done: a last heartbeat says so, so that its silence blames nobody."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._phase = "done"
        self.beat()

    def beat(self) -> Stall | None:
        """Write the heartbeat now (a file system or a service that refuses it ends the heartbeats,
        once); the verdict of the watchdog that received it, when that failed the run."""
        if self._broken:
            return None
        durations = list(self._durations)
        waiting, where = main_thread_state(self._main) if self._phase != "done" else (False, "")
        beat = Beat(rank=self.rank, time=time.time(), started=self.started, step=self.step,
                    stepped_at=self.stepped_at,
                    median_step_s=statistics.median(durations) if durations else None,
                    phase=self._phase, waiting=waiting, where=where, pid=os.getpid(), host=self.host)
        try:
            return self.send(beat)
        except OSError as err:
            self._broken = True
            try:   # best effort: on a full disk the log cannot take this line either
                print(f"heartbeat: not written ({err}); the watchdog cannot see this worker", file=sys.stderr)
            except OSError:
                pass
            return None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            verdict = self.beat()
            if verdict is not None:  # the service's watchdog failed the run and recorded why
                self._act(verdict, record=False)
            elif self.watch_peers:
                self._judge_peers()

    def _judge_peers(self) -> None:
        assert self.watchdog_s
        stall = judge(read_beats(self.run_dir, self.workers), time.time(), self.watchdog_s, self.started)
        if stall is not None:
            self._act(stall, record=True)

    def _act(self, stall: Stall, record: bool) -> None:
        """The ranks not blamed act (``on_stall``); when every rank is (all wait on a dropped
        link), all do. The first of them records the reason when ``record``."""
        if self.on_stall is None:
            return
        actors = [r for r in range(self.workers) if r not in stall.ranks] or list(range(self.workers))
        if self.rank in actors:
            self.on_stall(stall.reason, record and self.rank == actors[0])

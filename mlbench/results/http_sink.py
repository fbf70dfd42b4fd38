"""The worker's event sink on a cluster: events go over HTTP to the results service (`mlbench serve`).

Training never waits for the network: :meth:`HttpSink.write` only appends to an in-memory buffer,
and a background thread sends the buffer in batches. A batch that fails (the service restarts,
the network blips) stays in the buffer and is sent again with exponential back-off, so a
restart of the service loses nothing. Every event carries a per-rank sequence number (from
:func:`first_seq` on, so that a rank's worker started again numbers on); the service
stores each (run, rank, seq) once, whatever order the batches arrive in, and acknowledges a
batch only once all its events are stored; a batch that was stored but whose answer was lost is
not stored twice when it is sent again.

:meth:`close` (at the end of the worker) waits, up to a limit, until everything was delivered.

The buffer is bounded (``max_pending`` events): during a long outage the *oldest* unsent events
are dropped, counted, and reported on stderr (once when dropping starts, and in total at close),
so a worker's memory stays bounded and training still never waits; the newest events (the latest
progress, the result) are the ones kept. Blocking instead would stall training on the network.

The worker's heartbeat takes the same way to the service (:class:`HttpBeatSender`), but only the
latest counts: it is posted from the heartbeat's own thread and never queued.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlbench.errors import UsageError
from mlbench.results.events import EventSink, FileSink
from mlbench.results.heartbeat import Beat, write_beat
from mlbench.results.watchdog import Stall

TOKEN_HEADER = "X-Mlbench-Token"
MAX_PENDING = 200_000  # events (a few hundred bytes each): hours of outage at the usual rates
URL_ENV = "MLBENCH_RESULTS_URL"
TOKEN_ENV = "MLBENCH_RESULTS_TOKEN"
# statuses after which sending again cannot help (wrong token, run deleted, malformed batch)
_PERMANENT = {400, 401, 403, 404, 411, 413, 422}


def run_token(secret: str, run_id: str) -> str:
    """The token that lets the workers of one run, and only of that run, post its events:
    HMAC-SHA256 of the run id under the service's worker secret (RFC 2104). The service derives
    it again to check a request; the CLI derives it for the run's pods."""
    return hmac.new(secret.encode(), f"mlbench-run:{run_id}".encode(), hashlib.sha256).hexdigest()


def first_seq() -> int:
    """The sequence number of a sink's first event: the microseconds of the Unix time it starts.
    The service stores each (run, rank, seq) once, and a rank's worker may be a new process in
    the middle of a run (a restart of the group: a cluster's supervisor creates its pods again);
    numbered from 0 again, its events were taken for the earlier process's sent twice and
    dropped until its numbers passed that process's. No earlier process of the rank reaches this
    number (it would have had to send more than one event per microsecond since it started)."""
    return time.time_ns() // 1000


class _Permanent(Exception):
    """The service refused the batch for good."""


class HttpSink:
    """Buffers events and posts them in batches to ``URL/v1/runs/RUN/events``."""

    def __init__(self, url: str, token: str, run_id: str, rank: int, *, batch_size: int = 500,
                 interval: float = 1.0, first_backoff: float = 0.5, max_backoff: float = 30.0,
                 close_timeout: float = 120.0, request_timeout: float = 15.0,
                 max_pending: int = MAX_PENDING):
        self.endpoint = f"{url.rstrip('/')}/v1/runs/{run_id}/events"
        self.token = token
        self.rank = rank
        self.batch_size = batch_size
        self.interval = interval
        self.first_backoff = first_backoff
        self.max_backoff = max_backoff
        self.close_timeout = close_timeout
        self.request_timeout = request_timeout
        self.max_pending = max_pending
        self.dropped = 0
        self._buffer: deque[dict[str, Any]] = deque()
        self._seq = first_seq()
        self._closing = False
        self._dead = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._send_loop, name=f"events-rank-{rank}", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Events written but not yet acknowledged by the service."""
        with self._cond:
            return len(self._buffer)

    def write(self, event: dict[str, Any]) -> None:
        """Queue one event (never blocks on the network; drops the oldest when the buffer is full)."""
        with self._cond:
            if self._dead:
                return
            if len(self._buffer) >= self.max_pending:
                self._buffer.popleft()
                self.dropped += 1
                if self.dropped == 1:
                    print(f"mlbench: the results service is unreachable and {self.max_pending} metric "
                          "events are waiting; the oldest are dropped from now on", file=sys.stderr)
            self._buffer.append({**event, "seq": self._seq})
            self._seq += 1
            if len(self._buffer) in (1, self.batch_size):
                self._cond.notify()

    def close(self) -> None:
        """Deliver what is left (waiting at most ``close_timeout`` seconds), then stop."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(self.close_timeout)
        if self.dropped:
            print(f"mlbench: {self.dropped} metric events were dropped while the results service was "
                  f"unreachable (at most {self.max_pending} are kept)", file=sys.stderr)
        left = self.pending
        if left and not self._dead:
            print(f"mlbench: {left} metric events could not be delivered to the results service "
                  f"within {self.close_timeout:.0f}s", file=sys.stderr)

    # -- the sending thread -----------------------------------------------------------------
    def _next_batch(self) -> list[dict[str, Any]] | None:
        """Wait for a full batch, ``interval`` seconds, or close; None when done."""
        with self._cond:
            if not self._buffer and not self._closing:
                self._cond.wait()
            if self._buffer and len(self._buffer) < self.batch_size and not self._closing:
                self._cond.wait(self.interval)
            if not self._buffer:
                return None if self._closing else []
            return [self._buffer[i] for i in range(min(self.batch_size, len(self._buffer)))]

    def _send_loop(self) -> None:
        backoff = self.first_backoff
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            if not batch:
                continue
            try:
                self._post(batch)
            except _Permanent as err:
                print(f"mlbench: the results service refused metric events ({err}); "
                      "no more events are sent", file=sys.stderr)
                with self._cond:
                    self._dead = True
                    self._buffer.clear()
                return
            except (OSError, ValueError, KeyError):
                # transient (refused, reset, timeout, 5xx, a garbled answer): try again later
                time.sleep(backoff * (0.5 + random.random()))
                backoff = min(self.max_backoff, backoff * 2)
                continue
            backoff = self.first_backoff
            # a 200 means every event of the batch is stored (the oldest may have been dropped
            # from the buffer meanwhile); the service's next_seq cannot say so when the events
            # before the batch were dropped here in an outage and never reach it
            with self._cond:
                while self._buffer and self._buffer[0]["seq"] <= batch[-1]["seq"]:
                    self._buffer.popleft()

    def _post(self, batch: list[dict[str, Any]]) -> None:
        answer = _post_json(self.endpoint, self.token, {"rank": self.rank, "events": batch}, self.request_timeout)
        int(answer["next_seq"])  # a 200 that is not the service's answer raises, and is sent again


def _post_json(endpoint: str, token: str, body: dict[str, Any], timeout: float) -> Any:
    """The service's JSON answer to ``body``; :class:`_Permanent` when it refuses for good,
    OSError (or ValueError for a garbled answer) when trying again may help."""
    data = json.dumps(body, separators=(",", ":")).encode()
    request = urllib.request.Request(endpoint, data=data, method="POST", headers={
        "Content-Type": "application/json", TOKEN_HEADER: token})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        answer = err.read()
        if err.code in _PERMANENT and from_the_service(answer):
            raise _Permanent(f"HTTP {err.code}: {answer[:200].decode(errors='replace')}") from None
        # not the service's own refusal (its answers are JSON with "error"): something between,
        # e.g. a pod of the service being replaced; trying again may help
        raise OSError(f"HTTP {err.code}") from None


def from_the_service(answer: bytes) -> bool:
    """Whether an error answer is the results service's own (a JSON object with ``error``), not
    that of something between (the API server's proxy, a pod of the service being replaced)."""
    try:
        doc = json.loads(answer)
    except ValueError:
        return False
    return isinstance(doc, dict) and "error" in doc


class HttpBeatSender:
    """Posts a worker's heartbeat (:mod:`mlbench.results.heartbeat`) to ``URL/v1/runs/RUN/heartbeat``,
    where the service stores it for the pod supervisor's watchdog (a pod's run folder is
    read-only). Called from the heartbeat's own thread, about once a second, so it may block
    (``timeout`` at most) but never on training. Only the latest heartbeat matters: one that
    does not get through is not sent again, the next one replaces it; an outage longer than the
    watchdog's bound reads as a stall, as a frozen machine would. A refusal for good (wrong
    token, run deleted) raises OSError, which ends the heartbeats. Returns the verdict of the
    service's watchdog when it failed the run (:mod:`mlbench.server.watch`), for the worker to
    act on, as it acts on its own judgement of its peers on a shared run folder."""

    def __init__(self, url: str, token: str, run_id: str, *, timeout: float = 5.0):
        self.endpoint = f"{url.rstrip('/')}/v1/runs/{run_id}/heartbeat"
        self.token = token
        self.timeout = timeout
        self._failing = False

    def __call__(self, beat: Beat) -> Stall | None:
        try:
            answer = _post_json(self.endpoint, self.token, beat.to_json(), self.timeout)
        except _Permanent as err:
            raise OSError(f"the results service refused it ({err})") from None
        except (OSError, ValueError) as err:
            if not self._failing:  # once per outage
                print(f"heartbeat: the results service did not take it ({err}); trying every second",
                      file=sys.stderr)
            self._failing = True
            return None
        self._failing = False
        return _stall(answer.get("stalled") if isinstance(answer, dict) else None)


def _stall(data: Any) -> Stall | None:
    """The service's verdict in a heartbeat's answer (None for none, or for anything else)."""
    if not isinstance(data, dict) or not isinstance(data.get("reason"), str):
        return None
    ranks = data.get("ranks")
    if not isinstance(ranks, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        return None
    return Stall(tuple(ranks), data["reason"])


def open_sink(run_dir: str | os.PathLike, rank: int, run_id: str | None) -> EventSink:
    """HTTP to the results service when the environment names one (a pod), else a file per rank."""
    url = os.environ.get(URL_ENV)
    if not url:
        return FileSink(Path(run_dir), rank)
    token = os.environ.get(TOKEN_ENV)
    if not token or not run_id:
        raise UsageError(f"{URL_ENV} is set but {TOKEN_ENV} or the run id in run.json is missing; "
                         "set both or unset the URL to write events to files")
    return HttpSink(url, token, run_id, rank)


def beat_sender(run_dir: str | os.PathLike, run_id: str | None) -> Callable[[Beat], Stall | None]:
    """Where the worker's heartbeat goes, as :func:`open_sink` decides for its events: the results
    service when the environment names one (a pod), else the run folder."""
    url, token = os.environ.get(URL_ENV), os.environ.get(TOKEN_ENV)
    if url and token and run_id:
        return HttpBeatSender(url, token, run_id)
    return functools.partial(write_beat, Path(run_dir))

"""The dashboard's connections, bounded in count and time: uvicorn's h11 protocol with the results
service's two rules (:mod:`mlbench.server.connections`) added.

uvicorn (0.54) sets no timer before a connection's first request and cancels its keep-alive timer
at the first byte, so a connection that sends nothing, or a byte now and then, holds a socket for
ever: 1,100 of them from any local process passed an open-file limit of 1,024, after which
uvicorn could accept nothing and no page loaded. Here:

- a request's head must arrive within :data:`HEAD_SECONDS` of the connection opening, or of the
  end of its previous answer, however slowly it trickles; else the connection is closed;
- at most ``max_connections`` are open, accepted :data:`ACCEPT_BATCH` at a time
  (:func:`mlbench.server.connections.connection_bound`: below the open-file limit, which
  :func:`bounded_protocol` first raises towards what 4,096 need). One
  more closes the oldest connection that is waiting for a request head; when every open one is
  busy with a request (pages' live streams), the newcomer is answered 503 and closed.

A request under way (a live stream included) is not timed here: the dashboard's streams bound
what they hold themselves (:mod:`mlbench.dashboard.live`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from mlbench.server.connections import connection_bound, raise_file_limit

HEAD_SECONDS = 10.0     # a request's line and headers must have arrived this long after the wait began
MAX_CONNECTIONS = 4096  # open at once, if the limit on open files allows
#: Connections accepted in one turn of the event loop (uvicorn's ``backlog``, which asyncio also
#: takes as how many to accept at once: at uvicorn's 2,048, a burst of connections is accepted
#: past the open-file limit before any of them can be closed or evicted).
ACCEPT_BATCH = 64
THREADS = 40            # anyio's default pool, where the dashboard's request handlers read the store
_BUSY = b"the dashboard is busy: try again shortly"
BUSY_REPLY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
              b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_BUSY), _BUSY))


class BoundedH11Protocol(H11Protocol):
    """One connection of the dashboard (uvicorn's h11 protocol), closed when it waits too long
    for a request head, and refused when too many are open."""

    max_connections = MAX_CONNECTIONS
    head_seconds = HEAD_SECONDS

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.waiting_since = time.monotonic()
        self._head_timer: asyncio.TimerHandle | None = None

    def waiting(self) -> bool:
        """Whether it waits for a request head (none yet, or its last answer is complete)."""
        return self.cycle is None or self.cycle.response_complete

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.waiting_since = time.monotonic()
        if len(self.connections) > self.max_connections and not self._evict_oldest_waiting():
            transport.write(BUSY_REPLY)
            transport.close()
            return
        self._arm(self.head_seconds)

    def _evict_oldest_waiting(self) -> bool:
        waiting = [c for c in self.connections
                   if c is not self and isinstance(c, BoundedH11Protocol) and c.waiting()
                   and not c.transport.is_closing()]
        if not waiting:
            return False
        min(waiting, key=lambda c: c.waiting_since).transport.close()
        return True

    def _arm(self, delay: float) -> None:
        self._head_timer = self.loop.call_later(max(delay, 0.05), self._check_head)

    def _check_head(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if not self.waiting():
            self._arm(self.head_seconds)   # a request under way; its answer's end starts a new wait
            return
        left = self.waiting_since + self.head_seconds - time.monotonic()
        if left <= 0:
            self.transport.close()
        else:
            self._arm(left)

    def on_response_complete(self) -> None:
        self.waiting_since = time.monotonic()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)


def bounded_protocol() -> type[BoundedH11Protocol]:
    """The protocol class for uvicorn's ``Config(http=...)``, its connection bound taken from this
    process's limit on open files once raised as far as it may be."""
    raise_file_limit(THREADS, MAX_CONNECTIONS)
    bound = connection_bound(THREADS, MAX_CONNECTIONS)
    return type("DashboardProtocol", (BoundedH11Protocol,), {"max_connections": bound})

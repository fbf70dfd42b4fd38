"""What a worker process really sent over TCP: the payload bytes of its open sockets.

Linux keeps per socket the bytes of payload it has sent (``tcp_info.tcpi_bytes_sent``, Linux >=
4.19), retransmissions included. Summed over a process's TCP sockets, it sees every collective
whatever library made it: gloo's (PyTorch, JAX), gRPC's (TensorFlow), DDP's C++ all-reduce.
``mlbench check-optimizer`` holds an optimizer's own byte count to it, and the JAX and TensorFlow
ports report it as their ``comm/bytes`` (:class:`WireCounter`), since their collectives run inside
the framework, where no count of ours could see them.

A pod's worker also talks to the results service over TCP (its events and heartbeats): the
sockets whose peer is that service (``MLBENCH_RESULTS_URL``) are left out, so that what is
counted is the training's traffic between the workers.
"""

from __future__ import annotations

import os
import socket
import struct
from urllib.parse import urlsplit

from mlbench.results.http_sink import URL_ENV

#: Where struct tcp_info (linux/tcp.h) holds tcpi_bytes_sent (Linux >= 4.19).
TCPI_BYTES_SENT = 200


def service_peers(url: str | None = None) -> set[tuple[str, int]]:
    """The (address, port) pairs of the results service a pod's worker reports to (``url``, else
    the environment's), whose sockets are not training traffic; empty without one."""
    url = url if url is not None else os.environ.get(URL_ENV)
    if not url:
        return set()
    parts = urlsplit(url)
    if not parts.hostname:
        return set()
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(parts.hostname, port, proto=socket.IPPROTO_TCP)
    except OSError:
        return set()
    return {(str(info[4][0]), int(info[4][1])) for info in infos}


def wire_bytes_sent(exclude: set[tuple[str, int]] | frozenset[tuple[str, int]] = frozenset()) -> int | None:
    """TCP payload bytes this process has sent on its open TCP sockets (retransmissions
    included), less those to the peers in ``exclude``; None where the system does not say (not
    Linux, a kernel before 4.19)."""
    total = 0
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for fd in fds:
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        try:
            if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            if exclude:
                try:
                    peer = sock.getpeername()
                except OSError:
                    peer = None
                if peer is not None and (str(peer[0]), int(peer[1])) in exclude:
                    continue
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
            if len(info) < TCPI_BYTES_SENT + 8:
                return None
            total += struct.unpack_from("Q", info, TCPI_BYTES_SENT)[0]
        except OSError:
            continue
        finally:
            sock.close()
    return total


class WireCounter:
    """The bytes a process sent over TCP between two readings, its pauses left out.

    A socket that closes takes its count with it, so the counter reads deltas of the open
    sockets' sum and never lets a closed socket make one negative. :meth:`pause` and
    :meth:`resume` leave out what is sent between them (a port's evaluation, whose sums are
    all-gathered: not the training's communication)."""

    def __init__(self) -> None:
        self.exclude = frozenset(service_peers())
        self._base = wire_bytes_sent(self.exclude)
        self._pending = 0

    @property
    def available(self) -> bool:
        """Whether this system says what its sockets sent."""
        return self._base is not None

    def restart(self) -> None:
        """Count from now on (what was sent before is forgotten)."""
        self._base, self._pending = wire_bytes_sent(self.exclude), 0

    def pause(self) -> None:
        """Keep what was sent so far, and leave out what is sent until :meth:`resume`."""
        now = wire_bytes_sent(self.exclude)
        if now is not None and self._base is not None:
            self._pending += max(0, now - self._base)
        self._base = now

    def resume(self) -> None:
        self._base = wire_bytes_sent(self.exclude)

    def take(self) -> int | None:
        """The bytes sent since the last :meth:`take` (or the start), pauses left out; None
        where the system does not say."""
        now = wire_bytes_sent(self.exclude)
        if now is None or self._base is None:
            self._base = now
            return None
        sent = self._pending + max(0, now - self._base)
        self._base, self._pending = now, 0
        return sent

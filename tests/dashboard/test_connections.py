"""The dashboard's connections are bounded in count and time (mlbench.dashboard.connections): idle
and trickling clients from any local process cannot make it unreachable.

Real sockets to the real `mlbench dashboard` command, started under the open-file limit where the
audit broke it (1,024, soft and hard, so mlbench cannot raise it).
"""

from __future__ import annotations

import resource
import socket
import time

import pytest

from mlbench.dashboard.connections import HEAD_SECONDS
from tests.dashboard.conftest import Lab, serving, start_dashboard, stop_dashboard
from tests.results.recorded import record_run

IDLE = 1100
FILE_LIMIT = 1024


def _low_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FILE_LIMIT, FILE_LIMIT))


@pytest.fixture
def lab(tmp_path):
    from mlbench.results.store import RunStore

    record_run(RunStore(tmp_path / "home"), workers=1, tta=1.0, wall=2.0)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < IDLE + 200:
        pytest.skip(f"this test opens {IDLE} sockets; the hard limit on open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, IDLE + 200), hard))
    try:
        with serving(tmp_path, _low_file_limit) as lab:
            yield lab
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _port(lab: Lab) -> int:
    return int(lab.base.rsplit(":", 1)[1])


def _get_runs(lab: Lab, timeout: float) -> bytes:
    """One authenticated GET /api/runs on a new connection: its status line."""
    with socket.create_connection(("127.0.0.1", _port(lab)), timeout=timeout) as sock:
        sock.sendall(f"GET /api/runs HTTP/1.1\r\nHost: {lab.base.split('//', 1)[1]}\r\n"
                     f"Authorization: Bearer {lab.token}\r\nConnection: close\r\n\r\n".encode())
        return sock.recv(64).split(b"\r\n", 1)[0]


def _read_answer(sock: socket.socket) -> bytes:
    """One whole answer on a kept-alive connection: its status line (the body read past)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(4096) or b"\r\n\r\n"
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(length - len(body))
    return head.split(b"\r\n", 1)[0]


def _closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_1100_idle_connections_leave_the_dashboard_answering_within_seconds(lab):
    idle = []
    try:
        for _ in range(IDLE):
            sock = socket.create_connection(("127.0.0.1", _port(lab)), timeout=10)
            idle.append(sock)
        started = time.monotonic()
        assert _get_runs(lab, timeout=10) == b"HTTP/1.1 200 OK"
        assert time.monotonic() - started < 5
        assert lab.server.poll() is None
        # the oldest idle ones were closed to make room
        idle[0].settimeout(5)
        assert _closed_by_server(idle[0])
    finally:
        for sock in idle:
            sock.close()


def test_a_connection_that_sends_no_request_head_in_time_is_closed_even_if_it_trickles(lab):
    with socket.create_connection(("127.0.0.1", _port(lab)), timeout=5) as silent, \
            socket.create_connection(("127.0.0.1", _port(lab)), timeout=5) as trickling:
        started = time.monotonic()
        silent.settimeout(0.2)
        trickling.settimeout(0.2)
        silent_closed = trickle_closed = None
        part = b"GET /api/runs HTTP/1.1\r\nX-Slow: "
        while time.monotonic() - started < 3 * HEAD_SECONDS and None in (silent_closed, trickle_closed):
            if trickle_closed is None:
                try:
                    trickling.sendall(part[:1])
                    part = part[1:] or b"a"
                except OSError:
                    trickle_closed = time.monotonic() - started
                if trickle_closed is None and _closed_by_server(trickling):
                    trickle_closed = time.monotonic() - started
            if silent_closed is None and _closed_by_server(silent):
                silent_closed = time.monotonic() - started
            time.sleep(0.3)
    assert silent_closed is not None and silent_closed >= HEAD_SECONDS - 1, silent_closed
    assert trickle_closed is not None and trickle_closed >= HEAD_SECONDS - 1, trickle_closed
    # a client that sends its request in time is answered, and may send another after it
    with socket.create_connection(("127.0.0.1", _port(lab)), timeout=10) as sock:
        for _ in range(2):
            sock.sendall(f"GET /api/runs HTTP/1.1\r\nHost: {lab.base.split('//', 1)[1]}\r\n"
                         f"Authorization: Bearer {lab.token}\r\n\r\n".encode())
            assert _read_answer(sock) == b"HTTP/1.1 200 OK"


def test_when_every_open_connection_is_a_live_stream_a_newcomer_is_answered_503(tmp_path):
    """Under a limit of 300 open files the dashboard holds at most 76 connections (300 less what
    its threads and store may open: mlbench.server.connections.connection_bound); with that many
    live streams open, none of them waiting for a head, one more is refused with 503, and the
    streams go on."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300))

    lab = start_dashboard(tmp_path, limit)
    streams = []
    try:
        assert lab.url
        bound = 300 - (64 + 4 * 40)   # the files kept for its 40 threads and its store
        for _ in range(bound):
            sock = socket.create_connection(("127.0.0.1", _port(lab)), timeout=10)
            sock.sendall(f"GET /api/stream?runs=1 HTTP/1.1\r\nHost: {lab.base.split('//', 1)[1]}\r\n"
                         f"Authorization: Bearer {lab.token}\r\n\r\n".encode())
            assert sock.recv(64).startswith(b"HTTP/1.1 200 OK")
            streams.append(sock)
        with socket.create_connection(("127.0.0.1", _port(lab)), timeout=10) as newcomer:
            assert newcomer.recv(64).startswith(b"HTTP/1.1 503 Service Unavailable")
        streams[0].settimeout(0.5)
        assert not _closed_by_server(streams[0])
    finally:
        for sock in streams:
            sock.close()
        stop_dashboard(lab)

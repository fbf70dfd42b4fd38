"""The results service under many idle, trickling and stalled connections: `/healthz` answers at
once, a worker's events are all stored, and connections are bounded in count and in time."""

from __future__ import annotations

import json
import resource
import socket
import threading
import time
import urllib.request

import pytest

from mlbench.results.events import read_rank_events
from mlbench.results.http_sink import HttpSink, run_token
from tests.server.conftest import WORKER_TOKEN, new_run
from tests.server.test_service_hardening import InProcessService, request

IDLE, TRICKLING = 1000, 200


@pytest.fixture
def many_files():
    """Room for the test's sockets (and the service's, which inherits the limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * (IDLE + TRICKLING) + 1000
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"needs {need} open files; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def healthz_seconds(url: str) -> float:
    started = time.monotonic()
    with urllib.request.urlopen(url + "/healthz", timeout=30) as response:
        assert response.read() == b"ok"
    return time.monotonic() - started


def open_sockets(port: int, count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sockets.append(sock)
    return sockets


def closed_by_peer(sock: socket.socket, wait: float) -> bool:
    sock.settimeout(wait)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@pytest.mark.timeout(240)
def test_healthz_and_events_go_through_a_thousand_idle_and_trickling_connections(service, many_files):
    run_id = new_run(service, workers=1)
    idle = open_sockets(service.port, IDLE)
    trickling = open_sockets(service.port, TRICKLING)
    head = b"POST /v1/runs HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 200
    stop = threading.Event()

    def trickle() -> None:  # one header byte every 2 seconds on each
        for i in range(len(head)):
            for sock in trickling:
                try:
                    sock.send(head[i:i + 1])
                except OSError:
                    pass
            if stop.wait(2.0):
                return

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    try:
        time.sleep(3.0)  # the service holds all of them now
        sink = HttpSink(service.url, run_token(WORKER_TOKEN, run_id), run_id, 0, batch_size=10, interval=0.05,
                        first_backoff=0.05, max_backoff=0.5, close_timeout=60)
        for step in range(300):
            sink.write({"time": 1.0 + step, "rank": 0, "epoch": 0.0, "step": step, "name": "train/loss",
                        "value": 1.0 / (step + 1)})
        assert max(healthz_seconds(service.url) for _ in range(3)) < 3.0
        sink.close()
        assert sink.pending == 0
        events = read_rank_events(service.home / "runs" / run_id / "events" / "rank-0.jsonl")
        first = events[0]["seq"]
        assert [e["seq"] for e in events] == list(range(first, first + 300))
        assert [e["value"] for e in events] == [1.0 / (s + 1) for s in range(300)]
        # bounded in time: none of them has sent a whole request head within 10 s, all are closed
        deadline = time.monotonic() + 30
        assert all(closed_by_peer(s, max(0.1, deadline - time.monotonic())) for s in idle + trickling)
        assert healthz_seconds(service.url) < 3.0
    finally:
        stop.set()
        trickler.join()
        for sock in idle + trickling:
            sock.close()


def test_past_its_bound_the_oldest_idle_connection_is_closed_and_busy_ones_refuse_newcomers(tmp_path):
    svc = InProcessService(tmp_path / "store", timeout=5.0, max_threads=4, max_connections=10)
    try:
        idle = open_sockets(svc.port, 10)
        time.sleep(0.3)
        # an eleventh connection makes the oldest idle one close; the service still answers
        assert healthz_seconds(svc.url) < 3.0
        assert closed_by_peer(idle[0], 5.0)
        for sock in idle:
            sock.close()
        # connections whose head has come (a body that never does) are busy: a newcomer gets 503
        run = svc.new_run()
        headers = {"X-Mlbench-Token": run_token(WORKER_TOKEN, run), "Content-Length": "100"}
        stalled = open_sockets(svc.port, 10)
        for sock in stalled:
            sock.sendall(request(f"/v1/runs/{run}/events", headers))
        time.sleep(0.5)
        started = time.monotonic()
        answer = svc.raw(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", wait=5.0)
        assert answer.startswith(b"HTTP/1.1 503 ") and time.monotonic() - started < 3.0, answer
        assert "busy" in json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
        # ... until their bodies time out (5 s between reads)
        assert all(closed_by_peer(s, 15.0) for s in stalled)
        assert healthz_seconds(svc.url) < 3.0
        for sock in stalled:
            sock.close()
    finally:
        svc.close()

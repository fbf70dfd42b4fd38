"""The results service against careless and hostile clients, over real sockets: tokens before
bodies, lengths, malformed and deep JSON, idle connections, bounded threads, many clients at
once, escaped logs, disconnects, wrongly typed events, and one token per run."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import urllib.error
import urllib.request

import pytest

from mlbench.results.events import read_rank_events
from mlbench.results.http_sink import run_token
from mlbench.results.store import RUNNING
from mlbench.server import httpd as http_module
from mlbench.server.httpd import make_server
from mlbench.server.service import ResultsService
from tests.server.conftest import ADMIN_TOKEN, WORKER_TOKEN


class InProcessService:
    """The service's HTTP server in a thread of the test (its stderr is the test's)."""

    def __init__(self, home, **server_options):
        self.service = ResultsService(home, WORKER_TOKEN, ADMIN_TOKEN)
        self.server = make_server(self.service, "127.0.0.1", 0, **server_options)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def new_run(self, workers: int = 2) -> str:
        record = self.service.create({"task": "task1a", "workers": workers, "division": "closed",
                                      "launcher": "kubernetes", "run_json": {"task": "task1a"}})
        return record["id"]

    def raw(self, data: bytes, *, wait: float = 10.0, shutdown: bool = False) -> bytes:
        """Send ``data`` on a fresh connection; what the service answers until it closes (or ``wait``)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=wait) as sock:
            sock.sendall(data)
            if shutdown:
                sock.shutdown(socket.SHUT_WR)
            answer = b""
            try:
                while chunk := sock.recv(65536):
                    answer += chunk
            except TimeoutError:
                pass
            return answer

    def post(self, path: str, body: bytes, token: str | None) -> tuple[int, dict]:
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["X-Mlbench-Token"] = token
        request = urllib.request.Request(self.url + path, data=body, method="POST", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=20) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())


@pytest.fixture
def served(tmp_path):
    svc = InProcessService(tmp_path / "store", timeout=1.0, max_threads=8)
    yield svc
    svc.close()


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def request(path: str, headers: dict[str, str], body: bytes = b"", method: str = "POST") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: x", *[f"{k}: {v}" for k, v in headers.items()]]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def event(rank: int, seq: int, **fields) -> dict:
    return {"time": 1.0 + seq, "rank": rank, "epoch": 0.0, "step": seq, "name": "train/loss",
            "value": 0.5, "seq": seq, **fields}


# -- the token comes first ------------------------------------------------------------------

def test_a_request_without_token_is_refused_before_its_body_is_read(served):
    run = served.new_run()
    started = time.monotonic()
    for length in ("209715200", "-1", "", "lots"):
        headers = {"Content-Length": length} if length else {}
        answer = served.raw(request(f"/v1/runs/{run}/events", headers), wait=5.0)
        assert status_of(answer) == 401, answer
    # four answers without waiting for 200 MB, or for a body that never comes
    assert time.monotonic() - started < 4.0
    garbage = b"[" * 100_000
    assert status_of(served.raw(request(f"/v1/runs/{run}/events", {"Content-Length": str(len(garbage))},
                                        garbage))) == 401


def test_lengths_are_checked_and_bodies_read_up_to_the_limit(served):
    run = served.new_run()
    token = {"X-Mlbench-Token": run_token(WORKER_TOKEN, run)}
    assert status_of(served.raw(request(f"/v1/runs/{run}/events", token))) == 411
    for length in ("-1", "lots", "1e3"):
        assert status_of(served.raw(request(f"/v1/runs/{run}/events", {**token, "Content-Length": length}))) == 400
    huge = str(http_module.MAX_BODY + 1)
    started = time.monotonic()
    assert status_of(served.raw(request(f"/v1/runs/{run}/events", {**token, "Content-Length": huge}))) == 413
    assert time.monotonic() - started < 2.0


def test_malformed_and_deeply_nested_json_with_a_valid_token_is_400(served, capfd):
    run = served.new_run()
    token = run_token(WORKER_TOKEN, run)
    for body in (b"{not json", b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
                 b"\xff\xfe", b"[1, 2]"):
        status, answer = served.post(f"/v1/runs/{run}/events", body, token)
        assert status == 400, (body[:20], answer)
        assert "\n" not in answer["error"]
    assert served.post("/v1/runs", b"[" * 100_000, ADMIN_TOKEN)[0] == 400
    assert "Traceback" not in capfd.readouterr().err


# -- connections ------------------------------------------------------------------------------

def test_idle_and_half_sent_connections_time_out_and_threads_stay_bounded(served):
    baseline = threading.active_count()
    sockets = []
    for i in range(40):
        sock = socket.create_connection(("127.0.0.1", served.port), timeout=10)
        sock.sendall(b"POST /v1/runs HTTP/1.1\r\nHost: x\r\n" if i % 2 else b"")
        sockets.append(sock)
    time.sleep(0.5)
    assert threading.active_count() - baseline <= 8
    # the service still answers while they hang: each holds a thread for at most the timeout
    with urllib.request.urlopen(served.url + "/healthz", timeout=20) as response:
        assert response.read() == b"ok"
    deadline = time.monotonic() + 30
    for sock in sockets:  # closed by the service (a timeout here fails the test)
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            assert sock.recv(1024) == b""
        except ConnectionResetError:
            pass
        sock.close()
    time.sleep(1.5)
    assert threading.active_count() - baseline <= 1


def test_twenty_clients_at_once_lose_no_event(tmp_path):
    svc = InProcessService(tmp_path / "store")
    try:
        run = svc.new_run(workers=20)
        token = run_token(WORKER_TOKEN, run)
        barrier = threading.Barrier(20)
        results: list[tuple[int, dict]] = [None] * 20  # type: ignore[list-item]

        def client(rank: int) -> None:
            body = json.dumps({"rank": rank, "events": [event(rank, s) for s in range(50)]}).encode()
            barrier.wait()
            results[rank] = svc.post(f"/v1/runs/{run}/events", body, token)  # once: no retry

        threads = [threading.Thread(target=client, args=(rank,)) for rank in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert results == [(200, {"next_seq": 50})] * 20
        for rank in range(20):
            path = tmp_path / "store" / "runs" / run / "events" / f"rank-{rank}.jsonl"
            assert [e["seq"] for e in read_rank_events(path)] == list(range(50))
    finally:
        svc.close()


def test_logged_request_lines_are_escaped_and_disconnects_leave_no_traceback(served, capfd):
    served.raw(b"GET /\x1b[31mred\x07bell HTTP/1.1\r\nHost: x\r\n\r\n")
    served.raw(b"\x1b]0;pwned\x07 \x00\r\n\r\n")
    run = served.new_run()
    token = run_token(WORKER_TOKEN, run)
    for _ in range(20):
        # a client that sends half a body and resets the connection, and one that resets
        # before reading the answer
        with socket.create_connection(("127.0.0.1", served.port)) as sock:
            sock.sendall(request(f"/v1/runs/{run}/events", {"X-Mlbench-Token": token, "Content-Length": "100"},
                                 b'{"rank": 0'))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with socket.create_connection(("127.0.0.1", served.port)) as sock:
            sock.sendall(request("/v1/runs", {"X-Mlbench-Token": ADMIN_TOKEN}, method="GET"))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    time.sleep(1.5)
    err = capfd.readouterr().err
    assert "Traceback" not in err, err
    assert not any((ord(c) < 32 and c != "\n") or 127 <= ord(c) < 160 for c in err), repr(err)
    assert "\\x1b" in err


# -- events ---------------------------------------------------------------------------------

@pytest.mark.parametrize("fields, reason", [
    ({"time": "x"}, "time"), ({"time": None}, "time"), ({"epoch": "1"}, "epoch"), ({"step": 1.5}, "step"),
    ({"rank": True}, "rank"), ({"name": 3}, "name"), ({"value": None}, "value"), ({"seq": "1"}, "seq"),
])
def test_wrongly_typed_events_are_refused_with_a_one_line_reason(served, fields, reason):
    run = served.new_run()
    body = json.dumps({"rank": 0, "events": [event(0, 0), {**event(0, 1), **fields}]}).encode()
    status, answer = served.post(f"/v1/runs/{run}/events", body, run_token(WORKER_TOKEN, run))
    assert status == 400 and reason in answer["error"] and "\n" not in answer["error"], answer
    assert read_rank_events(tmp_events(served, run, 0)) == []


def tmp_events(served, run: str, rank: int):
    return served.service.store.runs_dir / run / "events" / f"rank-{rank}.jsonl"


def test_a_batch_whose_rank_is_a_bool_is_refused(served):
    run = served.new_run()
    body = json.dumps({"rank": True, "events": [event(1, 0)]}).encode()
    assert served.post(f"/v1/runs/{run}/events", body, run_token(WORKER_TOKEN, run))[0] == 400


# -- one token per run ------------------------------------------------------------------------

def test_each_run_has_its_own_token_and_only_rank_0_of_an_active_run_posts_its_result(served):
    first, second = served.new_run(), served.new_run()
    batch = json.dumps({"rank": 0, "events": [event(0, 0)]}).encode()
    # the token of one run cannot write into another, and the shared secret is no run's token
    assert served.post(f"/v1/runs/{second}/events", batch, run_token(WORKER_TOKEN, first))[0] == 401
    assert served.post(f"/v1/runs/{second}/events", batch, WORKER_TOKEN)[0] == 401
    assert served.post(f"/v1/runs/{second}/events", batch, ADMIN_TOKEN)[0] == 401
    assert read_rank_events(tmp_events(served, second, 0)) == []
    # a run token reads nothing
    assert served.post("/v1/runs", b"{}", run_token(WORKER_TOKEN, first))[0] == 401

    token = run_token(WORKER_TOKEN, first)
    result = {"name": "result", "value": {"reached": True, "steps": 1}}
    forged = json.dumps({"rank": 1, "events": [event(1, 0, **result)]}).encode()
    status, answer = served.post(f"/v1/runs/{first}/events", forged, token)
    assert status == 403 and "rank 0" in answer["error"], answer
    served.service.store.update(first, state=RUNNING)
    honest = json.dumps({"rank": 0, "events": [event(0, 0, **result)]}).encode()
    assert served.post(f"/v1/runs/{first}/events", honest, token) == (200, {"next_seq": 1})
    served.service.store.mark_ended(first, "failed", reason="a worker failed")
    late = json.dumps({"rank": 0, "events": [event(0, 1, **result)]}).encode()
    status, answer = served.post(f"/v1/runs/{first}/events", late, token)
    assert status == 403 and "failed" in answer["error"], answer
    # other events of an ended run are still stored (the last lines of a failing worker)
    other = json.dumps({"rank": 1, "events": [event(1, 0, name="error", value="boom")]}).encode()
    assert served.post(f"/v1/runs/{first}/events", other, token) == (200, {"next_seq": 1})

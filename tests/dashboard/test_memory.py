"""The dashboard's memory stays bounded (issue 21, item 5): stream clients that never read while a
run's log grows fast are dropped instead of buffered for, and a huge request body is refused with
413 before it is read.

Real HTTP to the real `mlbench dashboard` command over a store of its own (no browser); memory is
the process's resident set size from /proc/PID/status.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.dashboard.conftest import Lab, serving
from tests.results.recorded import record_run

STALLED = 100
LOG_RATE = 5 * 1024 * 1024      # bytes a second
GROW_SECONDS = 16


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def bare(tmp_path):
    from mlbench.results.store import RunStore

    record = record_run(RunStore(tmp_path / "home"), workers=1, tta=1.0, wall=2.0)
    (record.run_dir / "logs").mkdir(exist_ok=True)
    with serving(tmp_path) as lab:
        yield lab, record


def connect(lab: Lab) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once: the client never reads
    sock.settimeout(30)
    sock.connect(("127.0.0.1", int(lab.base.rsplit(":", 1)[1])))
    return sock


def head(lab: Lab, method: str, path: str, extra: str = "") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: {lab.base.split('//', 1)[1]}\r\n"
            f"Authorization: Bearer {lab.token}\r\nOrigin: {lab.base}\r\n{extra}\r\n").encode()


def status_and_body(sock: socket.socket) -> tuple[int, bytes]:
    answer = b""
    try:
        while b"\r\n\r\n" not in answer and (chunk := sock.recv(65536)):
            answer += chunk
        head_part, _, body = answer.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head_part.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length and (chunk := sock.recv(65536)):
            body += chunk
    except ConnectionResetError:
        head_part, _, body = answer.partition(b"\r\n\r\n")
    return int(head_part.split(b" ", 2)[1]), body


@pytest.mark.timeout(240)
def test_stream_clients_that_do_not_read_are_dropped_while_a_log_grows(bare):
    lab, record = bare
    pid = lab.server.pid
    log = record.run_dir / "logs" / "rank-0.log"
    log.write_text("started\n")
    stalled = [connect(lab) for _ in range(STALLED)]
    for sock in stalled:
        sock.sendall(head(lab, "GET", f"/api/stream?run={record.id}"))
    time.sleep(2.0)
    before = rss_mb(pid)
    line = ("x" * 99 + "\n").encode()
    samples = []
    try:
        with open(log, "ab") as f:
            for _second in range(GROW_SECONDS):
                started = time.monotonic()
                f.write(line * (LOG_RATE // len(line)))
                f.flush()
                samples.append(rss_mb(pid))
                time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
        samples.append(rss_mb(pid))
        # the old dashboard queued every update for every stalled page: +160 MB in 16 s here, and
        # growing; now about +40 MB, flat
        assert max(samples) - before < 100, (before, samples)
        # and a page that reads still gets its stream
        with connect(lab) as reader:
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            reader.sendall(head(lab, "GET", f"/api/stream?run={record.id}"))
            got = b""
            deadline = time.monotonic() + 30
            while b"event: run" not in got and time.monotonic() < deadline:
                got += reader.recv(65536)
            assert b"event: run" in got
    finally:
        for sock in stalled:
            sock.close()


def test_a_huge_new_run_body_is_refused_with_413_before_it_is_read(bare):
    lab, _ = bare
    pid = lab.server.pid
    before = rss_mb(pid)
    size = 20 * 1024 * 1024
    for extra in (f"Content-Type: application/json\r\nContent-Length: {size}\r\n",
                  "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"):
        with connect(lab) as sock:
            started = time.monotonic()
            sock.sendall(head(lab, "POST", "/api/runs", extra))
            chunked = "chunked" in extra
            payload = b'{"task": "' + b"a" * (1 << 20)

            def send_body(sock=sock, payload=payload, chunked=chunked) -> None:
                try:
                    for _ in range(size // len(payload)):
                        sock.sendall(b"%x\r\n%s\r\n" % (len(payload), payload) if chunked else payload)
                except OSError:
                    pass  # the dashboard answered and closed: the rest is never sent

            sender = threading.Thread(target=send_body, daemon=True)
            sender.start()
            status, body = status_and_body(sock)
            assert status == 413, body
            error = json.loads(body)["error"]
            assert "\n" not in error and "65536" in error, error
            assert time.monotonic() - started < 10.0
        sender.join(30)
    assert rss_mb(pid) - before < 50
    # a malformed small body is one line too
    with connect(lab) as sock:
        body = b"{not json"
        extra = f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        sock.sendall(head(lab, "POST", "/api/runs", extra) + body)
        status, answer = status_and_body(sock)
        assert status == 400 and "\n" not in json.loads(answer)["error"]

"""A real results service (`python -m mlbench.server`) on 127.0.0.1, started and killed by tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

WORKER_TOKEN = "worker-" + "a" * 32
ADMIN_TOKEN = "admin-" + "b" * 32


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServiceProcess:
    """One service on a fixed port and store; ``kill`` and ``start`` again to restart it."""

    def __init__(self, home: Path, port: int, log: Path):
        self.home, self.port, self.log = home, port, log
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> ServiceProcess:
        env = dict(os.environ, MLBENCH_WORKER_TOKEN=WORKER_TOKEN, MLBENCH_ADMIN_TOKEN=ADMIN_TOKEN)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mlbench.server", "--host", "127.0.0.1", "--port", str(self.port),
                 "--home", str(self.home)], stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as response:
                    if response.read() == b"ok":
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"the service did not start: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        """SIGKILL: no chance to finish anything (a crash, an OOM kill, a node gone)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def call(self, method: str, path: str, body: dict | None = None, token: str | None = ADMIN_TOKEN):
        """(status, parsed JSON) of one request."""
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["X-Mlbench-Token"] = token
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())


@pytest.fixture
def service(tmp_path):
    svc = ServiceProcess(tmp_path / "store", free_port(), tmp_path / "service.log").start()
    yield svc
    svc.kill()


def new_run(service: ServiceProcess, workers: int = 2) -> str:
    status, record = service.call("POST", "/v1/runs", {
        "task": "task1a", "workers": workers, "division": "closed", "launcher": "kubernetes",
        "run_json": {"task": "task1a", "config": {"workers": workers}}})
    assert status == 200, record
    return record["id"]

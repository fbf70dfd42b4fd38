"""The launcher matrix (issue 20, part 5): every launcher x {cancel from the CLI, cancel from the
dashboard, end of run seen by `status` and by the dashboard}, checking that the launcher's own
action happened (processes gone, the Slurm job CANCELLED, the pods deleted) and that the CLI
and the dashboard say the same.

A launcher's case (:class:`LauncherCase`) says how to start a run that goes on until it is
cancelled, how to start one that ends by itself, and how to see that its workers are gone; the
checks here are the same for every launcher. The cases live beside the fixtures they need:
local, mpi and external in tests/test_launcher_matrix.py, Slurm in tests/slurm, Kubernetes in
tests/kube.

The dashboard is its real Starlette application (:func:`mlbench.dashboard.app.create_app`) over
this test's run stores, served by uvicorn on a free loopback port in a thread, and asked over
HTTP with its bearer token, as a script would.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tests.helpers import mlbench, wait_for

#: How long a launcher may take to end a cancelled run's workers (the local supervisor's grace is
#: 4 s, Slurm's scancel a few seconds, a pod's deletion up to its grace period), with margin.
STOP_TIMEOUT_S = 90.0


@dataclass
class LauncherCase:
    """How the matrix drives one launcher."""

    name: str
    #: Start a run that trains until it is cancelled; returns its id once its workers run.
    start_endless: Callable[[], str]
    #: Start a run that ends by itself (a few steps); returns its id.
    start_short: Callable[[], str]
    #: Whether the launcher's own stop happened for run ID (processes, job, pods gone).
    workers_gone: Callable[[str], bool]
    #: A phrase of the reason a cancel records.
    cancel_reason: str = "cancelled by the user"


class Dashboard:
    """The dashboard's real app over this test's stores, served on a loopback port."""

    def __init__(self, sources: Any):
        import uvicorn

        from mlbench.dashboard.app import create_app

        self.token = secrets.token_urlsafe(16)
        app = create_app(sources, self.token, cookie_name="mlbench_dashboard_test", allowed_hosts=None,
                         interval=0.5)
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.base = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                                     timeout_graceful_shutdown=2))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def __enter__(self) -> Dashboard:
        self._thread.start()
        wait_for(lambda: self._server.started, 30, "the dashboard to listen")
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=20)
        self._sock.close()

    def call(self, method: str, path: str) -> dict[str, Any]:
        request = urllib.request.Request(f"{self.base}{path}", method=method, headers={
            "Authorization": f"Bearer {self.token}", "X-Mlbench-Dashboard": "1"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())

    def state(self, run_id: str) -> str:
        return str(self.call("GET", f"/api/runs/{run_id}")["run"]["state"])


@contextmanager
def dashboard(sources: Any = None) -> Iterator[Dashboard]:
    """The dashboard over ``sources`` (default: this machine's run store)."""
    from mlbench.dashboard.sources import Sources
    from mlbench.results.store import RunStore

    with Dashboard(sources or Sources(RunStore())) as served:
        yield served


def cli_state(run_id: str) -> dict[str, Any]:
    proc = mlbench("status", run_id, "-o", "json", check=True)
    return json.loads(proc.stdout)


def check_cancel_from_the_cli(case: LauncherCase) -> None:
    run_id = case.start_endless()
    proc = mlbench("cancel", run_id, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == f"Run {run_id} cancelled.", proc.stdout + proc.stderr
    _check_cancelled(case, run_id)


def check_cancel_from_the_dashboard(case: LauncherCase, sources: Any = None) -> None:
    run_id = case.start_endless()
    with dashboard(sources) as served:
        answer = served.call("POST", f"/api/runs/{run_id}/cancel")
        assert answer["state"] == "cancelled" and case.cancel_reason in answer["reason"], answer
        assert served.state(run_id) == "cancelled"
    _check_cancelled(case, run_id)


def _check_cancelled(case: LauncherCase, run_id: str) -> None:
    wait_for(lambda: case.workers_gone(run_id), STOP_TIMEOUT_S, f"the {case.name} launcher to stop run {run_id}",
             interval=0.5)
    status = cli_state(run_id)
    assert status["state"] == "cancelled" and case.cancel_reason in status["reason"], status
    # how far it got reads the same in the table of runs as in `status RUN` (from its events)
    listed = next(r for r in json.loads(mlbench("status", "-o", "json", check=True).stdout)["runs"]
                  if r["id"] == run_id)
    assert (listed["epoch"], listed["metric_value"]) == (status["epoch"], status["metric_value"]), listed
    follow = mlbench("status", run_id, "--follow")
    assert follow.returncode == 130, follow.stdout + follow.stderr  # as `mlbench run` exits for it


def check_end_seen_by_status_and_the_dashboard(case: LauncherCase, sources: Any = None) -> None:
    run_id = case.start_short()
    follow = mlbench("status", run_id, "--follow", timeout=600)
    assert follow.returncode == 0, follow.stdout + follow.stderr  # finished, no goal (synthetic data)
    assert cli_state(run_id)["state"] == "finished"
    with dashboard(sources) as served:
        assert served.state(run_id) == "finished"
    # the supervisor records the end, then exits (with the data it drew for its ranks, a moment later)
    wait_for(lambda: case.workers_gone(run_id), STOP_TIMEOUT_S, f"the processes of run {run_id} to exit",
             interval=0.2)

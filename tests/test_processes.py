"""Recorded pids are checked for identity (pid, start time) before they are judged or signalled.

A run's supervisor and worker pids outlive the processes; once the kernel reuses a number for an
unrelated process, `mlbench status` must not take that process for the run's supervisor (the run
would stay "running" forever), and neither `status` nor `cancel` may signal it.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from click.testing import CliRunner

from mlbench.cli import (
    cli,
    commands,  # noqa: F401  (registers the commands)
)
from mlbench.launch.processes import ProcessRef, start_ticks
from mlbench.results.store import RunStore


@pytest.fixture
def stranger():
    """An unrelated process that leads its own process group, as a reused pid would name."""
    proc = subprocess.Popen(["sleep", "120"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def _run_with_reused_pids(stranger: subprocess.Popen):
    """A local run marked running whose recorded supervisor and worker are gone and whose pids
    the kernel has given to ``stranger`` (recorded start times differ from the live one's)."""
    store = RunStore()
    run = store.create(task="task2a", workers=1, division="open", launcher="local", run_json={})
    store.mark_running(run.id, stranger.pid)
    earlier = start_ticks(stranger.pid) - 1
    (run.run_dir / "supervisor.json").write_text(json.dumps([stranger.pid, earlier]))
    (run.run_dir / "pids.json").write_text(json.dumps({
        "supervisor": stranger.pid, "workers": [stranger.pid], "network": None,
        "identity": {str(stranger.pid): earlier}}))
    return store, run


def test_the_start_time_names_a_process():
    proc = subprocess.Popen(["sleep", "30"])
    try:
        me = ProcessRef.of(proc.pid)
        assert me.started is not None and me.alive()
        assert not ProcessRef(proc.pid, me.started + 1).alive()      # the same pid, another process
        assert ProcessRef.from_json(me.to_json()) == me
        assert ProcessRef.from_json(proc.pid) == ProcessRef(proc.pid)  # records without start times
        assert ProcessRef.from_json(None) is None and ProcessRef.from_json(True) is None
    finally:
        proc.kill()
        proc.wait()
    assert not me.alive()  # a zombie, then gone


def test_status_takes_a_reused_supervisor_pid_for_a_dead_supervisor_and_signals_nothing(stranger):
    store, run = _run_with_reused_pids(stranger)
    result = CliRunner().invoke(cli, ["status"])
    assert result.exit_code == 0, result.output
    final = store.get(run.id)
    assert final.state == "failed" and "supervising process" in final.reason
    time.sleep(0.2)
    assert stranger.poll() is None  # the unrelated process lives on


def test_cancel_leaves_a_process_that_reused_a_recorded_pid_alone(stranger):
    store, run = _run_with_reused_pids(stranger)
    result = CliRunner().invoke(cli, ["cancel", run.id])
    assert result.exit_code == 0, result.output
    assert store.get(run.id).state in ("cancelled", "failed")
    time.sleep(0.2)
    assert stranger.poll() is None

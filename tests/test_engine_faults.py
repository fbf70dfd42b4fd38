"""Faults and bad input: a crashed worker, Ctrl-C, detach/cancel, two runs at once, error lines."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlbench.cli import (
    cli,
    commands,  # noqa: F401  (registers the commands)
)
from mlbench.launch.supervisor import pid_alive
from mlbench.results.events import read_rank_events
from mlbench.results.store import RunStore
from tests.helpers import events, mlbench, start_cli, wait_for

LONG_RUN = ("run", "task1a", "2", "--data", "synthetic", "--max-steps", "100000", "--log-every", "2")




def wait_training(timeout: float = 90):
    """The newest run, once both workers have logged training steps; and its worker pids."""
    def ready():
        runs = RunStore().list()
        if not runs:
            return None
        run = runs[-1]
        pids_file = run.run_dir / "pids.json"
        trained = all(any(e["name"] == "train/loss"
                          for e in read_rank_events(run.run_dir / "events" / f"rank-{r}.jsonl"))
                      for r in (0, 1))
        return (run, json.loads(pids_file.read_text())["workers"]) if trained and pids_file.exists() else None
    return wait_for(ready, timeout, "both workers to train")


def test_a_killed_worker_fails_the_run_within_seconds_and_leaves_no_process(tmp_path):
    cli = start_cli(*LONG_RUN)
    run, workers = wait_training()
    os.kill(workers[1], signal.SIGKILL)
    killed_at = time.monotonic()
    out, err = cli.communicate(timeout=30)
    assert time.monotonic() - killed_at < 20   # idle: 2-5 s; the point is "not gloo's 300 s"
    assert cli.returncode == 1
    assert "worker 1 was killed by SIGKILL" in err and "Traceback" not in err + out
    assert all(not pid_alive(pid) for pid in workers)
    record = RunStore().get(run.id)
    assert record.state == "failed" and "worker 1 was killed by SIGKILL" in record.reason
    # what was recorded before the crash is still readable
    assert any(e["name"] == "train/loss" and e["rank"] == 1 for e in events(record))
    assert mlbench("download", run.id, "-o", str(tmp_path / "f.zip")).returncode == 0


def test_ctrl_c_cancels_the_run_and_ends_every_worker():
    cli = start_cli(*LONG_RUN)
    run, workers = wait_training()
    cli.send_signal(signal.SIGINT)
    out, err = cli.communicate(timeout=15)
    assert cli.returncode == 130
    assert "cancelled" in err and "Traceback" not in err + out
    assert all(not pid_alive(pid) for pid in workers)
    record = RunStore().get(run.id)
    assert record.state == "cancelled"
    assert any(e["name"] == "train/loss" for e in events(record))


def test_sigterm_ends_a_worker_blocked_on_a_stopped_peer_within_seconds():
    # the all-reduce waits in C++ for a peer that never answers; Python's handler alone would run
    # only at the group's timeout (minutes): a pod would wait for its SIGKILL
    cli = start_cli(*LONG_RUN)
    _, workers = wait_training()
    os.kill(workers[1], signal.SIGSTOP)
    time.sleep(1)
    os.kill(workers[0], signal.SIGTERM)
    signalled = time.monotonic()
    wait_for(lambda: not pid_alive(workers[0]), 15, "worker 0 to end after SIGTERM")
    assert time.monotonic() - signalled < 12   # idle: about SIGTERM_GRACE_SECONDS (2 s)
    _, err = cli.communicate(timeout=30)
    assert cli.returncode == 1 and "worker 0 exited with code 143" in err, err
    assert all(not pid_alive(pid) for pid in workers)


def test_detach_returns_at_once_and_cancel_stops_the_run():
    started = time.monotonic()
    proc = mlbench(*LONG_RUN, "--detach", check=True)
    assert time.monotonic() - started < 30 and "in the background" in proc.stdout
    run, workers = wait_training()
    assert "running" in mlbench("status", check=True).stdout
    assert mlbench("cancel", run.id, check=True).stdout.strip().endswith("cancelled.")
    assert all(not pid_alive(pid) for pid in workers)
    assert RunStore().get(run.id).state == "cancelled"


def test_two_runs_at_once_each_get_their_own_rendezvous():
    args = ("run", "task2a", "2", "--data", "synthetic", "--max-steps", "8", "--log-every", "4", "--detach")
    mlbench(*args, check=True)
    mlbench(*args, check=True)
    store = RunStore()
    wait_for(lambda: all(not r.active for r in store.list()), 120, "both runs to end")
    runs = store.list()
    assert [r.state for r in runs] == ["finished", "finished"]
    ports = {json.loads((r.run_dir / "run.json").read_text())["config"]["master_port"] for r in runs}
    assert len(ports) == 2


def test_a_run_whose_supervisor_vanished_is_marked_failed_and_its_workers_ended():
    mlbench(*LONG_RUN, "--detach", check=True)
    run, workers = wait_training()
    os.kill(RunStore().get(run.id).supervisor_pid, signal.SIGKILL)
    wait_for(lambda: all(not pid_alive(p) for p in workers), 10, "workers to die with their supervisor")
    table = mlbench("status", check=True).stdout
    assert "failed" in table
    assert "supervising process" in RunStore().get(run.id).reason


@pytest.mark.parametrize("args,code,message", [
    (("run", "task9", "2"), 2, "unknown task 'task9'"),
    (("run", "task1a", "0"), 2, "at least 1"),
    (("run", "task1a", "2", "--data-dir", "/nonexistent/folder"), 2, "no such folder"),
    (("run", "task1a", "2", "--set", "momentum=x"), 2, "expected a float"),
    (("run", "task1a", "2", "--time-budget", "soon"), 2, "invalid duration"),
    (("run", "task1a", "2", "--optimizer", "magic"), 2, "unknown optimizer"),
    (("run", "task1a", "2", "--backend", "nccl", "--device", "cpu"), 2, "needs GPUs"),
    # bounds, before a run exists (nothing forks, no worker crashes on a zero batch)
    (("run", "task1a", "100000"), 2, "this machine can start at most"),
    (("run", "task1a", "1", "2", "100000", "--data", "synthetic"), 2, "100000 workers"),
    (("run", "task1a", "2", "--set", "batch_per_worker=0"), 2, "batch_per_worker=0: must be at least 1"),
    (("run", "task1a", "2", "--set", "batch_per_worker=-5"), 2, "must be at least 1"),
    (("run", "task1a", "2", "--set", "goal_light=5"), 2, "a fraction above 0 and at most 1"),
    (("run", "task1a", "2", "--set", "max_epochs=0"), 2, "max_epochs=0: must be at least 1"),
    (("run", "task1a", "2", "--set", "momentum=1.5"), 2, "below 1"),
    (("run", "task1a", "2", "--set", "lr.milestones=82,10"), 2, "increasing epochs"),
    (("run", "task3a", "2", "--set", "goal_full=0.5"), 2, "perplexity goal is above 1"),
    (("run", "task3a", "2", "--set", "extra.dropout=1.2"), 2, "below 1"),
    (("run", "task4b", "2", "--set", "goal_full=250"), 2, "at most 100"),
    (("run", "task1a", "2", "--time-budget", "100000000000000000000h"), 2, "at most 30 days"),
    (("status", "nosuchrun"), 2, "no run 'nosuchrun'"),
    (("download", "nosuchrun"), 2, "no run 'nosuchrun'"),
    (("delete", "nosuchrun", "--yes"), 2, "no run 'nosuchrun'"),
])
def test_usage_errors_are_one_line_with_exit_code_2(args, code, message):
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
    assert isinstance(result.exception, SystemExit)  # a clean exit, not an escaped exception


def test_missing_and_corrupt_data_are_one_line_and_record_nothing(cifar_dir, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = mlbench("run", "task1a", "2", "--data-dir", str(empty))
    assert proc.returncode == 1 and "cifar-10-batches-py" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    broken = tmp_path / "broken" / "cifar-10-batches-py"
    broken.mkdir(parents=True)
    for f in (Path(cifar_dir) / "cifar-10-batches-py").iterdir():
        (broken / f.name).write_bytes(f.read_bytes()[:200] if f.name == "data_batch_2" else f.read_bytes())
    proc = mlbench("run", "task1a", "2", "--data-dir", str(broken.parent))
    assert proc.returncode == 1 and "data_batch_2" in proc.stderr and "Traceback" not in proc.stderr
    assert RunStore().list() == []


def test_offline_download_says_where_to_put_the_files(monkeypatch, tmp_path):
    proc = mlbench("run", "task1a", "1")  # MLBENCH_DATA is an empty folder and there is no internet
    assert proc.returncode == 1
    assert "could not download CIFAR-10" in proc.stderr and "--data-dir" in proc.stderr


def test_reconciling_a_stale_record_does_not_overwrite_a_finished_run(tmp_path):
    """`status` may hold a run as running while its supervisor marks it finished and exits."""
    from mlbench.launch.registry import launcher_class
    store = RunStore(tmp_path / "home")
    run = store.create(task="task1a", workers=1, division="closed", run_json={})
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    store.mark_running(run.id, gone.pid)
    stale = store.get(run.id)
    assert store.mark_ended(run.id, "finished", result={"reached": True})
    after = launcher_class("local")(store).reconcile(stale)
    assert (after.state, after.result) == ("finished", {"reached": True})
    assert not store.mark_ended(run.id, "cancelled", reason="too late")
    assert store.get(run.id).state == "finished"


def test_a_run_whose_workers_cannot_be_started_is_marked_failed(tmp_path, monkeypatch):
    from mlbench.launch import forked, supervisor
    from mlbench.launch.registry import launcher_class

    def no_processes(*args, **kwargs):
        raise OSError(11, "Resource temporarily unavailable")

    from mlbench.launch.plan import RunRequest

    launcher = launcher_class("local")(RunStore(tmp_path / "home"))
    run = launcher.create(RunRequest(task="task1a", workers=2, data="synthetic"))
    monkeypatch.setattr(supervisor.subprocess, "Popen", no_processes)   # workers started fresh
    monkeypatch.setattr(forked.os, "fork", no_processes)                 # workers forked (fork's EAGAIN)
    with pytest.raises(OSError):
        launcher.run_attached(run)
    store = launcher.store
    after = store.get(run.id)
    assert after.state == "failed" and "could not be started" in after.reason

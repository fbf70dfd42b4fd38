"""Following runs from another command: `status RUN --follow` and `logs RUN [--follow]`."""

from __future__ import annotations

import json
import os
import shutil

from tests.helpers import mlbench


def _started(proc) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("Started run ")[1].split()[0]


def test_status_follow_prints_a_detached_runs_progress_until_it_ends():
    run_id = _started(mlbench("run", "task2a", "2", "--data", "synthetic", "--max-steps", "40",
                              "--log-every", "10", "--detach"))
    follow = mlbench("status", run_id, "--follow")
    assert follow.returncode == 0, follow.stderr
    lines = follow.stdout.splitlines()
    assert lines[0].startswith(f"Run {run_id} (task2a-2w-") and "2 worker(s)" in lines[0]
    steps = [int(line.split("step")[1].split()[0]) for line in lines if " step " in line]
    assert steps == [10, 20, 30, 40]
    assert lines[-2] == "Finished (max-steps): 40 steps, 0.20 epochs in " + lines[-2].split(" in ")[1]
    assert lines[-1].endswith(f"Details: mlbench status {run_id}")
    status = json.loads(mlbench("status", run_id, "-o", "json", check=True).stdout)
    assert status["state"] == "finished" and status["summary"]["steps"] == 40


def test_logs_print_a_workers_output_and_follow_returns_when_the_run_ends(libsvm_dir, tmp_path):
    data = shutil.copytree(libsvm_dir, tmp_path / "data")
    # fresh interpreters (MLBENCH_NO_FORK): the worker, still importing torch, will not find its data
    run_id = _started(mlbench("run", "task2a", "1", "--data-dir", str(data), "--detach",
                              env=dict(os.environ, MLBENCH_NO_FORK="1")))
    shutil.rmtree(data)
    followed = mlbench("logs", run_id, "--follow")
    assert followed.returncode == 0 and followed.stderr == ""
    assert followed.stdout.startswith(f"Error: the data folder {data} does not exist; ")
    assert json.loads(mlbench("status", run_id, "-o", "json", check=True).stdout)["state"] == "failed"
    again = mlbench("logs", run_id, "--rank", "0")
    assert again.stdout == followed.stdout
    wrong = mlbench("logs", run_id, "--rank", "1")
    assert (wrong.returncode, wrong.stderr) == (2, f"Error: --rank 1: run {run_id} has workers 0..0\n")


def test_follow_needs_one_run_and_no_output_format():
    for args in (["status", "--follow"], ["status", "abc", "--follow", "-o", "json"]):
        proc = mlbench(*args)
        assert (proc.returncode, proc.stderr) == (
            2, "Error: --follow follows one run's progress lines: give RUN, and no -o\n")


def test_status_follow_exits_with_the_code_run_gives_a_run_that_missed_its_goal(libsvm_dir):
    run_id = _started(mlbench("run", "task2a", "1", "--data-dir", str(libsvm_dir), "--set", "max_epochs=1",
                              "--set", "goal_full=0.9999", "--detach"))
    follow = mlbench("status", run_id, "--follow")
    assert follow.returncode == 3, follow.stdout + follow.stderr  # as `mlbench run` exits for it
    assert "not reached" in follow.stdout
    assert mlbench("status", run_id, "--follow").returncode == 3  # an ended run: at once, the same code

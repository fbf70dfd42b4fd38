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


def test_logs_of_a_run_whose_workers_wrote_nothing_say_so_and_where_its_metrics_are():
    """A finished run's workers print nothing (their metrics are events): `logs` says so in one
    line on standard error instead of printing nothing; the log itself, on standard out, stays empty."""
    proc = mlbench("run", "task2a", "2", "--data", "synthetic", "--max-steps", "4", check=True)
    run_id = proc.stdout.split("Details: mlbench status ")[1].split()[0]
    line = f"Run {run_id}: its 2 workers wrote no output; its metrics and result: mlbench status {run_id}\n"
    for args in ((), ("--rank", "1"), ("--follow",)):
        shown = mlbench("logs", run_id, *args)
        assert (shown.returncode, shown.stdout, shown.stderr) == (0, "", line), args


def test_logs_of_a_silent_worker_point_to_the_one_that_wrote(tmp_path):
    from mlbench.cli.follow import no_output
    from mlbench.results.store import RunStore

    store = RunStore(tmp_path / "store")
    record = store.create(task="task2a", workers=3, division="closed",
                          run_json={"task": "task2a", "division": "closed", "config": {"workers": 3}})
    logs = record.run_dir / "logs"
    logs.mkdir(exist_ok=True)
    for rank, text in enumerate(("", "", "Error: the data folder is gone\n")):
        (logs / f"rank-{rank}.log").write_text(text)
    assert no_output(record, 0) == (f"Worker 0 of run {record.id} wrote no output; worker 2 did: "
                                    f"mlbench logs {record.id} --rank 2")
    (logs / "rank-2.log").write_text("")
    assert no_output(record, 0) == (f"Run {record.id}: its 3 workers wrote no output so far; its metrics and "
                                    f"result: mlbench status {record.id}")


def test_logs_of_a_record_only_run_say_where_its_launcher_put_them():
    proc = mlbench("run", "task2a", "1", "--data", "synthetic", "--record-only", check=True)
    run_id = proc.stdout.split("Recorded run ")[1].split()[0]
    shown = mlbench("logs", run_id)
    assert (shown.returncode, shown.stdout) == (1, "")
    assert shown.stderr == (f"Error: run {run_id} is a --record-only run: its workers' output is where their "
                            f"launcher put it (torchrun's terminal, srun's --output); its metrics and result: "
                            f"mlbench status {run_id}\n")

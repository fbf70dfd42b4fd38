"""Task 0a, the all-reduce benchmark, on 2 and 4 real processes (gloo)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from mlbench.cli import (
    cli,
    commands,  # noqa: F401  (registers the commands)
)
from mlbench.tasks.task0a.sweep import bus_factor, gbps_cell, message_sizes
from tests.helpers import events, last_run, mlbench, run_json


def test_message_sizes_are_decades_up_to_the_cap():
    assert message_sizes(10**8) == [10**e for e in range(9)]
    assert message_sizes(1) == [1]
    assert message_sizes(5000) == [1, 10, 100, 1000, 5000]
    assert bus_factor(1) == 0 and bus_factor(2) == 1 and bus_factor(4) == 1.5


@pytest.mark.parametrize("workers", [2, 4])
def test_sweep_has_every_size_and_bus_bandwidth_matches_the_measured_time(workers):
    proc = mlbench("run", "task0a", str(workers), "--max-size", "1e4", check=True)
    run = last_run()
    assert run.state == "finished" and run.task == "task0a"
    assert run_json(run)["changed"] == ["max_size=10000"] and run.division == "open"
    rows = run.result["rows"]
    sizes = [1, 10, 100, 1000, 10_000]
    assert [(r["dtype"], r["elements"]) for r in rows] == [(d, n) for d in ("fp32", "fp16", "bf16") for n in sizes]
    for row in rows:
        size = row["elements"] * (4 if row["dtype"] == "fp32" else 2)
        assert row["bytes"] == size and row["wrong"] == 0 and row["iterations"] >= 2
        assert 0 < row["time_s"] <= row["time_max_s"]
        assert row["algbw_gbps"] == pytest.approx(size / row["time_s"] / 1e9)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * (workers - 1) / workers)
        line = next(s for s in proc.stdout.splitlines() if s.split()[:2] == [row["dtype"], str(row["elements"])])
        assert gbps_cell(row["busbw_gbps"]) in line.split()
    assert [e["value"] for e in events(run) if e["name"] == "allreduce"] == rows
    assert "Peak bus bandwidth" in proc.stdout
    details = mlbench("status", run.id, check=True).stdout
    assert "busbw (GB/s)" in details and details.count("fp16 ") == len(sizes)


@pytest.mark.parametrize("args,message", [
    (("run", "task1a", "2", "--max-size", "100"), "--max-size applies to the all-reduce benchmark task0a"),
    (("run", "task0a", "2", "--max-size", "0"), "expected a whole number of elements"),
    (("run", "task0a", "2", "--max-size", "2.5"), "expected a whole number of elements"),
    (("run", "task0a", "2", "--optimizer", "powersgd"), "takes no --optimizer"),
    (("run", "task0a", "2", "--set", "momentum=0"),
     "--set momentum: task0a measures the all-reduce itself; its keys are iterations, warmup, seconds_per_size"),
    (("run", "task0a", "2", "--set", "iterations=0"), "--set iterations=0: must be at least 1"),
    (("run", "task0a", "2", "--set", "iterations=2.5"), "--set iterations=2.5: expected a int"),
    (("run", "task2a", "2", "--set", "iterations=5"), "task2a has no setting 'iterations'"),
    (("run", "task2a", "2", "--set", "momentun=0"), "no task has a setting 'momentun'; did you mean momentum?"),
])
def test_wrong_benchmark_arguments_are_usage_errors(args, message):
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 2, result.output
    assert message in result.stderr


def test_a_sweep_with_its_own_repetitions_is_open_and_compared_apart_from_the_default():
    """`--set iterations=3 --set warmup=1`: every size timed 2 or 3 times (at least 2, within the
    budget) instead of up to 20; the run is open division for it, and `compare` puts it in a
    family of its own beside the default sweep."""
    import json

    mlbench("run", "task0a", "2", "--max-size", "100", check=True)
    default = last_run()
    mlbench("run", "task0a", "2", "--max-size", "100", "--set", "iterations=3", "--set", "warmup=1", check=True)
    fewer = last_run()
    assert run_json(fewer)["changed"] == ["iterations=3", "warmup=1", "max_size=100"] and fewer.division == "open"
    assert run_json(fewer)["config"]["task"]["iterations"] == 3
    assert all(2 <= row["iterations"] <= 3 for row in fewer.result["rows"])
    assert max(row["iterations"] for row in default.result["rows"]) > 3
    compared = json.loads(mlbench("compare", default.id, fewer.id, "-o", "json", check=True).stdout)
    assert len(compared["families"]) == 2
    assert {d["key"]: d["values"] for d in compared["differences"]} == {
        "set.iterations": ["20", "3"], "set.warmup": ["5", "1"]}, compared["differences"]


def test_tasks_lists_the_benchmark():
    result = CliRunner().invoke(cli, ["tasks"])
    assert result.exit_code == 0
    assert "task0a: Communication: all-reduce" in result.output and "1 .. 1e8 elements" in result.output

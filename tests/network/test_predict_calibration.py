"""`mlbench predict` from a calibration made here: the collectives a worker counts, the
calibration's real runs (task 0a's sweeps on the machine's own and an emulated network, each
optimizer's short runs), its prediction at the calibration's own worker count held to the
sweep it was read from, and --validate of runs made after it."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from mlbench.results.compare import RunResult
from mlbench.results.store import RunStore
from tests.helpers import events, last_run, mlbench, run_json

SHORT = ("--data", "synthetic", "--max-steps", "20", "--log-every", "5")


@pytest.mark.parametrize(("options", "per_rank"),
                         [((), 20), (("--optimizer", "model-averaging", "--opt", "period=2"), 10)])
def test_each_rank_counts_the_collectives_of_its_training_steps(options, per_rank):
    """Task 2a's model is one tensor: all-reduce SGD sends one collective a step, model
    averaging every second step; 20 steps make 20 and 10 on each rank (evaluations not counted)."""
    mlbench("run", "task2a", "2", *SHORT, *options, check=True)
    evs = events(last_run())
    for rank in (0, 1):
        counts = [e["value"] for e in evs if e["rank"] == rank and e["name"] == "comm/collectives"]
        assert len(counts) == 4 and sum(counts) == per_rank, counts


def _loglog(sizes: list[float], times: list[float], size: float) -> float:
    """The sweep's time at ``size``, interpolated in log-log as docs/predict.md says."""
    if size <= sizes[0]:
        return times[0]
    for x0, y0, x1, y1 in zip(sizes, times, sizes[1:], times[1:]):
        if x0 <= size <= x1:
            share = math.log(size / x0) / math.log(x1 / x0)
            return y0 * (y1 / y0) ** share
    raise AssertionError(f"{size} is past the sweep")


def _two_worker_time(link: dict, size: float) -> float:
    """A 2-worker link's time at ``size``: the sweep's, but never below its two latency steps
    (a size whose time the noise put under the small messages' median costs the latency)."""
    return max(_loglog(link["sizes"], link["times_s"], size), 2 * link["alpha_s"])


@pytest.mark.timeout(600)   # nine sweeps and two training runs, then five more runs to validate
def test_a_calibration_made_here_predicts_from_its_own_runs_and_validates_a_later_one(shaping, tmp_path):
    made = mlbench("predict", "task2a", "--calibrate", "--busy-ok", "--data", "synthetic", "--calibration-steps", "20",
                   "--max-size", "100000", "--sweep-iterations", "30", "--calibration-repeat", "2", "--workers", "2,4",
                   "--bandwidth", "100mbit,30mbit",
                   "--chart", str(tmp_path / "charts"), "-o", "json", timeout=540)
    assert made.returncode == 0, made.stderr
    answer = json.loads(made.stdout)   # the chart's lines went to stderr
    for suffix in ("png", "svg"):
        drawn = tmp_path / "charts" / f"task2a-predicted.{suffix}"
        assert drawn.stat().st_size > 1000 and f"Wrote {drawn}" in made.stderr
    links = answer["calibration"]["links"]
    assert set(links) == {"not emulated", "100 Mbit/s", "30 Mbit/s"}
    # each network's link is the median of its three sweeps, task0a runs of 2 workers
    listed = json.loads(mlbench("status", "-o", "json", check=True).stdout)["runs"]
    sweeps = {r["id"]: r for r in listed if r["task"] == "task0a"}
    assert len(sweeps) == 9
    for sweep in sweeps.values():   # --sweep-iterations 30: task0a's --set, in the calibration's budget
        task_spec = run_json(RunStore().get(sweep["id"]))["config"]["task"]
        assert (task_spec["iterations"], task_spec["seconds_per_size"]) == (30, 1.0), task_spec
    sources = [link["source"].split(", ") for link in links.values()]
    assert all(len(ids) == 3 for ids in sources) and {i for ids in sources for i in ids} == set(sweeps)
    # alpha: the mean over sweeps' messages of 1 KB or less of at least one element a rank (40
    # and 400 bytes) of their time over a 2-worker ring's 2 steps; a rate limit delays no small
    # message, so the two rates
    # share one, from their six sweeps, and the machine's own network keeps its three sweeps'
    steps = {}
    for link in links.values():
        for sweep in link["source"].split(", "):
            rows = RunResult.load(RunStore().get(sweep)).sweep.rows
            steps[link["network"], sweep] = [row["time_s"] / 2 for row in rows
                                             if row["dtype"] == "fp32" and row["bytes"] <= 1024
                                             and row["elements"] >= 2]
    assert all(len(times) == 2 for times in steps.values())
    shared = [t for (network, _), times in steps.items() if network != "not emulated" for t in times]
    own = [t for (network, _), times in steps.items() if network == "not emulated" for t in times]
    assert links["100 Mbit/s"]["alpha_s"] == pytest.approx(sum(shared) / 12, rel=1e-12)
    assert links["30 Mbit/s"]["alpha_s"] == pytest.approx(sum(shared) / 12, rel=1e-12)
    assert links["not emulated"]["alpha_s"] == pytest.approx(sum(own) / 6, rel=1e-12)
    runs = answer["calibration"]["runs"]["centralized-sgd"]
    assert sorted(r["workers"] for r in runs) == [1, 1, 2, 2]       # --calibration-repeat 2
    twos = [r for r in runs if r["workers"] == 2]
    assert all(r["collectives_per_step"] == 1.0 and r["wire_bytes_per_step"] == 8000 for r in twos)  # 2000 fp32
    # the model reads the two repeats as one run: their median (of two, the mean) per figure
    two = {"run": ", ".join(r["run"] for r in twos), "network": twos[0]["network"],
           **{k: statistics.median(r[k] for r in twos) for k in ("communication_s", "compute_s")}}
    predicted = {(p["network"], p["workers"]): p for p in answer["predictions"]}
    assert set(predicted) == {(rate, n) for rate in ("100 Mbit/s", "30 Mbit/s") for n in (2, 4)}
    # the calibration run's communication phase beyond its own link's sweep is carried as is
    own = links["not emulated"]
    assert two["network"] == "not emulated"
    overhead = max(0.0, two["communication_s"] - _two_worker_time(own, 8000))
    assert predicted["100 Mbit/s", 2]["overhead_s"] == pytest.approx(overhead, rel=1e-9, abs=1e-12)
    # at the sweep's own worker count, communication is the sweep's time at the step's message
    link = links["100 Mbit/s"]
    expected = _two_worker_time(link, 8000)
    assert predicted["100 Mbit/s", 2]["communication_s"] == pytest.approx(expected + overhead, rel=1e-9)
    assert predicted["100 Mbit/s", 2]["compute_s"] == pytest.approx(two["compute_s"], rel=1e-9)
    # 4 workers: 6 latency steps instead of 2, 1.5 of the message per rank instead of 1
    alpha = link["alpha_s"]
    beta = (expected - 2 * alpha) / 8000
    assert predicted["100 Mbit/s", 4]["communication_s"] == pytest.approx(
        6 * alpha + 1.5 * 8000 * beta + overhead, rel=1e-9)
    assert predicted["100 Mbit/s", 4]["steps_to_goal"] is None     # synthetic data: no goal, never guessed

    mlbench("run", "task2a", "2", *SHORT, "--bandwidth", "100mbit", check=True)
    later = last_run()
    mlbench("run", "task2a", "2", *SHORT, "--bandwidth", "100mbit", check=True)
    second = last_run()
    # a validation predicts each run from the calibration alone: never from another run it validates
    validated = json.loads(mlbench("predict", "--validate", later.id, second.id, "-o", "json",
                                   check=True).stdout)["validation"]
    assert [v["run"] for v in validated] == [later.id, second.id]
    for checked in validated:
        assert checked["predicted"]["traffic_from"] == two["run"], checked["predicted"]
        assert checked["predicted"]["overhead_s"] == pytest.approx(overhead, rel=1e-9, abs=1e-12)
    shown = mlbench("predict", "--validate", later.id, check=True).stdout
    row = next(line for line in shown.splitlines() if line.startswith(later.id))
    assert "centralized-sgd" in row and "100 Mbit/s" in row and "%" in row
    assert "median absolute error" in shown
    beside = mlbench("status", later.id, "--predicted", check=True).stdout.strip().splitlines()[-1]
    assert beside.startswith("Predicted step ") and "; measured " in beside and "100 Mbit/s" in beside, beside
    as_json = json.loads(mlbench("status", later.id, "--predicted", "-o", "json", check=True).stdout)["predicted"]
    assert as_json["workers"] == 2 and as_json["measured_step_s"] > 0 and as_json["step_s"] > 0
    # a straggler for the whole run: every step waits for it, so the step is 10x the one without
    # it, predicted (one calibration for both); measured, the slowed rank sleeps 9x its own step
    # after each, and the others' step is that sleep and that step (within 2x: a 5-step
    # interval's median against its mean)
    mlbench("run", "task2a", "2", *SHORT, "--bandwidth", "100mbit", "--inject", "slow:rank=1,factor=10", check=True)
    slowed = last_run()
    plain, checked = json.loads(mlbench("predict", "--validate", second.id, slowed.id, "-o", "json",
                                        check=True).stdout)["validation"]
    guess = checked["predicted"]
    assert guess["straggler_factor"] == 10.0 and guess["checkpoint_s"] == 0.0
    assert guess["step_s"] == pytest.approx(10 * plain["predicted"]["step_s"], rel=1e-9)
    slept = {e["step"]: e["value"] for e in events(slowed) if e["name"] == "fault/slowed" and e["value"] > 0}
    per_step = statistics.median(slept[step] / 5 for step in sorted(slept)[1:])   # after the warm-up interval
    assert 0.5 < checked["measured_step_s"] / (per_step * 10 / 9) < 2, (checked, slept)
    # a checkpoint every 10 steps: the other checkpointing run's measured cost over 10 steps; the
    # run's own step time leaves out the interval that held its checkpoint
    for _ in range(2):
        mlbench("run", "task2a", "2", *SHORT, "--bandwidth", "100mbit", "--checkpoint-every", "10steps", check=True)
    other, kept = RunStore().list()[-2:]
    checked = json.loads(mlbench("predict", "--validate", kept.id, "-o", "json", check=True).stdout)["validation"][0]
    written = [e["value"]["seconds"] for e in events(other) if e["name"] == "checkpoint"]
    assert written, "the other run wrote no checkpoint"
    assert checked["predicted"]["checkpoint_s"] == pytest.approx(statistics.median(written) / 10, rel=1e-9)
    refused = mlbench("predict", "task2a", "--bandwidth", "10gbit", "--optimizer", "powersgd")
    assert refused.returncode == 2
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: no finished run of task2a with --optimizer powersgd"), last

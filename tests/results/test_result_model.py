"""One model of a result: every goal metric's name, unit and format, and task 0a's sweep as a
result beside a training run's (the surfaces themselves: tests/dashboard/test_surface_matrix.py)."""

from __future__ import annotations

import pytest

from mlbench.results.outcome import AllreduceResult, TrainingResult, read_result
from mlbench.results.report import task_metric
from mlbench.tasks.metrics import ACCURACY, ALGORITHM_BANDWIDTH, BLEU, BUS_BANDWIDTH, LATENCY, PERPLEXITY


@pytest.mark.parametrize("metric,value,shown,cell,axis", [
    (ACCURACY, 0.812, "81.20%", "81.20%", "test accuracy (%)"),
    (PERPLEXITY, 915.69, "915.69", "ppl 915.69", "validation perplexity (lower is better)"),
    (BLEU, 21.3, "21.30", "BLEU 21.30", "BLEU"),
    (BUS_BANDWIDTH, 0.003849, "0.00385 GB/s", "0.00385 GB/s", "bus bandwidth (GB/s)"),
    (BUS_BANDWIDTH, 12.4, "12.4 GB/s", "12.4 GB/s", "bus bandwidth (GB/s)"),
    (LATENCY, 310.44, "310.4 us", "310.4 us", "small-message latency (us, lower is better)"),
])
def test_each_metric_is_shown_in_its_unit_and_a_fraction_alone_in_percent(metric, value, shown, cell, axis):
    assert metric.format(value) == shown and metric.cell(value) == cell and metric.axis_label == axis
    assert metric.display(value) == pytest.approx(100 * value if metric is ACCURACY else value)
    assert metric.format(None) == metric.cell(None) == "-"


def test_every_task_has_its_metric():
    assert [task_metric(t).name for t in ("task0a", "task1a", "task2a", "task3a", "task4b")] == [
        "bus bandwidth", "accuracy", "accuracy", "perplexity", "bleu"]
    assert PERPLEXITY.describe_goal(90.0) == "validation perplexity <= 90.00"


ROWS = [{"dtype": dtype, "elements": n, "bytes": n * size, "iterations": 20, "time_s": t,
         "time_max_s": t, "algbw_gbps": n * size / t / 1e9, "busbw_gbps": n * size / t / 1e9, "wrong": 0}
        for dtype, size in (("fp32", 4), ("fp16", 2)) for n, t in ((1, 3e-4 if size == 4 else 2e-4), (1000, 1e-3))]


def test_a_sweep_is_a_result_with_a_headline_and_a_sentence():
    recorded = {"kind": "allreduce", "goal": None, "backend": "gloo", "device": "cpu", "workers": 2,
                "rows": ROWS, "wrong": 0, "steps": 80, "epochs": 0.0, "train_time": 1.0, "eval_time": 0.0,
                "stop_reason": "sweep complete"}
    sweep = read_result(recorded)
    assert isinstance(sweep, AllreduceResult) and sweep.goal_metric is BUS_BANDWIDTH
    assert sweep.headline == pytest.approx(0.004) and sweep.latency_us == pytest.approx(300.0)
    assert sweep.sentence() == ("Peak bus bandwidth 0.004 GB/s (fp32, 1000 elements, 2 workers, gloo); "
                                "small-message latency 300.0 us.")
    alone = read_result({**recorded, "workers": 1, "rows": [{**r, "busbw_gbps": 0.0} for r in ROWS]})
    assert alone.goal_metric is ALGORITHM_BANDWIDTH and alone.headline == pytest.approx(0.004)
    assert isinstance(read_result({"goal": 0.8, "final_accuracy": 0.9}), TrainingResult)
    assert read_result(None) is None and read_result({"kind": "something newer"}) is None

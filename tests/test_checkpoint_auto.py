"""``--checkpoint-every auto[:MTBF]``: checkpoints at Daly's optimum interval from the measured
checkpoint cost and the mean time between failures (given, or the --inject schedule's).

Daly's higher-order estimate is checked against the optimum of his own model of the expected
wall time (J. T. Daly, FGCS 22, 2006, eq. 20), minimised numerically; a real run's chosen interval
is recomputed from its own checkpoint events."""

from __future__ import annotations

import math
import statistics

import pytest

from mlbench.errors import UsageError
from mlbench.launch.faults import parse_inject
from mlbench.launch.plan import RunRequest, build_config
from mlbench.results.store import RunStore
from mlbench.checkpoint_schedule import daly_interval
from tests.helpers import events, mlbench, run_json


def _expected_wall(tau: float, delta: float, mtbf: float, restart: float = 0.0, work: float = 1.0) -> float:
    """Daly's expected wall time of ``work`` seconds of computation, a checkpoint of ``delta``
    after every ``tau`` of it, exponential failures of mean ``mtbf``."""
    return mtbf * math.exp(restart / mtbf) * (math.exp((tau + delta) / mtbf) - 1) * work / tau


@pytest.mark.parametrize("delta,mtbf", [(0.0078, 6.0), (5.0, 3600.0), (60.0, 86400.0), (1.0, 10.0)])
def test_the_interval_is_the_optimum_of_dalys_model(delta, mtbf):
    young = math.sqrt(2 * delta * mtbf)
    grid = [young * 0.1 * 1.0005 ** i for i in range(9300)]      # 0.1 to 10 times Young's
    best = min(grid, key=lambda tau: _expected_wall(tau, delta, mtbf))
    chosen = daly_interval(delta, mtbf)
    assert abs(chosen - best) / best < 0.02
    # its wall time is the model's optimum to 0.01%
    assert _expected_wall(chosen, delta, mtbf) <= _expected_wall(best, delta, mtbf) * 1.0001
    assert young * 0.8 < chosen < young * 1.1   # Young's, nearly
    assert daly_interval(30.0, 10.0) == 10.0     # a checkpoint dearer than 2 MTBF: once per MTBF


def _config(**request):
    config, _ = build_config(RunRequest(task="task2a", workers=2, data="synthetic", **request))
    return config


def test_the_mtbf_is_the_given_one_or_the_schedules():
    assert _config(checkpoint_auto_mtbf_s=7200.0).checkpoint_auto_mtbf_s == 7200.0
    kill = [parse_inject("kill:rank=1,every=rand(4s,8s)")]
    assert _config(checkpoint_auto_mtbf_s=0.0, faults=kill, on_failure="restart").checkpoint_auto_mtbf_s == 6.0
    # rates add: 1/6 + 1/3
    both = [parse_inject("kill:rank=1,every=6s"), parse_inject("stall:rank=0,every=3s,for=1s")]
    assert _config(checkpoint_auto_mtbf_s=0.0, faults=both).checkpoint_auto_mtbf_s == pytest.approx(2.0)
    config = _config(checkpoint_auto_mtbf_s=0.0, faults=kill, on_failure="restart")
    assert config.checkpoints and config.checkpoint_every_s is None     # restart's default interval not added
    with pytest.raises(UsageError, match="auto needs the mean time between failures"):
        _config(checkpoint_auto_mtbf_s=0.0)


def test_the_cli_refuses_auto_without_an_mtbf_in_one_line():
    proc = mlbench("run", "task2a", "2", "--data", "synthetic", "--checkpoint-every", "auto")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "auto needs the mean time between failures" in proc.stderr
    proc = mlbench("run", "task2a", "2", "--data", "synthetic", "--checkpoint-every", "auto:soon")
    assert proc.returncode == 2 and "auto:MTBF takes the mean time between failures" in proc.stderr


def test_a_run_checkpoints_at_dalys_interval_for_its_measured_cost():
    mlbench("run", "task2a", "2", "--data", "synthetic", "--max-steps", "3000", "--no-stop", "--set",
            "max_epochs=100000", "--log-every", "500", "--checkpoint-every", "auto:5s", check=True)
    run = RunStore().list()[-1]
    assert run_json(run)["config"]["checkpoint_auto_mtbf_s"] == 5.0
    rank0 = [e for e in events(run) if e["rank"] == 0]
    costs, chosen = [], []
    for event in rank0:
        if event["name"] == "checkpoint":
            costs.append(event["value"]["seconds"])
        elif event["name"] == "checkpoint/interval":
            chosen.append(event["value"])
            assert event["value"]["cost_s"] == pytest.approx(statistics.median(costs))
            assert event["value"]["seconds"] == pytest.approx(daly_interval(statistics.median(costs), 5.0))
    assert len(chosen) == len(costs) >= 2
    table = mlbench("status", run.id, check=True).stdout
    assert "(auto: Daly's optimum for a checkpoint cost of" in table and "an MTBF of 5.0s)" in table

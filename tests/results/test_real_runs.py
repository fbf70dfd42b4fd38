"""Real short runs end to end: `run --repeat`, then compare, charts and the MLPerf log from them.

Four task2a runs (1 and 2 worker processes, two repeats each, CPU/gloo) on the LIBSVM fixture;
the light goal is reached within the first epoch, so every run has a real time to accuracy.
"""

import os
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner
from mlperf_logging.compliance_checker import mlp_parser
from PIL import Image

import mlbench.cli.commands  # noqa: F401  (registers the commands)
from mlbench.cli import cli
from mlbench.results.store import RunStore
from tests.helpers import mlbench as mlbench_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real_runs(libsvm_dir, tmp_path_factory):
    """(MLBENCH_HOME, stdout) of `mlbench run task2a 1 2 --repeat 2`."""
    base = tmp_path_factory.mktemp("real-runs")
    env = dict(os.environ, MLBENCH_HOME=str(base / "home"), MLBENCH_DATA=str(base / "data"),
               MLBENCH_CONFIG_DIR=str(base / "config"))
    proc = mlbench_cli("run", "task2a", "1", "2", "--repeat", "2", "--light", "--data-dir", str(libsvm_dir),
                   "--log-every", "2", env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return base / "home", proc.stdout


@pytest.fixture
def home(real_runs, monkeypatch):
    monkeypatch.setenv("MLBENCH_HOME", str(real_runs[0]))
    return real_runs[0]


def invoke(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_repeat_runs_each_worker_count_with_distinct_recorded_seeds_in_one_group(home, real_runs):
    runs = RunStore().list()
    assert [(r.workers, r.seed) for r in runs] == [(1, 0), (2, 0), (1, 1), (2, 1)]
    assert all(r.state == "finished" and r.result["reached"] for r in runs)
    groups = {r.group_id for r in runs}
    assert len(groups) == 1 and None not in groups
    assert f"Compare these 4 runs: mlbench compare --group {groups.pop()}" in real_runs[1]


def test_compare_shows_both_worker_counts_with_their_repeats(home):
    out = invoke("compare", "--task", "task2a")
    # the tests' LIBSVM pair is not epsilon: custom data, open division
    assert "task2a | open division | centralized-sgd" in out and "goal test accuracy >= 80.00%" in out
    rows = [line.split() for line in out.splitlines() if line[:2] in ("1 ", "2 ")]
    assert [r[:2] for r in rows] == [["1", "2/2"], ["2", "2/2"]]
    assert rows[0][rows[0].index("1.00x") + 1] == "100%"
    assert "Cost: local runs cost nothing" in out


def test_charts_are_four_valid_pngs_and_svgs_of_sensible_size(home, tmp_path):
    out = invoke("charts", "--task", "task2a", "--out-dir", tmp_path, "--price-per-hour", "0.19")
    assert "Wrote 8 files" in out
    for name in ("speedup", "cost", "loss-accuracy", "communication"):
        png, svg = tmp_path / f"task2a-{name}.png", tmp_path / f"task2a-{name}.svg"
        assert 10_000 < png.stat().st_size < 200_000
        with Image.open(png) as image:
            image.verify()
            assert image.format == "PNG" and 600 <= image.size[0] <= 1200 and 400 <= image.size[1] <= 600
        root = ET.parse(svg).getroot()
        assert root.tag.endswith("svg") and svg.stat().st_size < 500_000
        # the figure is the data, not the "nothing to show" note
        assert "no run reached its goal" not in svg.read_text()


def test_download_mlperf_writes_a_log_the_mlperf_parser_reads(home, tmp_path):
    run = RunStore().list()[1]
    out = invoke("download", run.id, "--format", "mlperf", "-o", tmp_path / "r.zip")
    log = tmp_path / "r.mllog.txt"
    assert (tmp_path / "r.zip").exists() and f"Wrote {log}" in out
    lines, errors = mlp_parser.parse_file(str(log), ruleset="6.0.0")
    assert errors == []
    keys = [line.key for line in lines]
    assert keys.index("init_start") < keys.index("run_start") < keys.index("eval_accuracy") < keys.index("run_stop")
    stop = lines[keys.index("run_stop")]
    assert stop.value["metadata"]["status"] == "success"
    value = {line.key: line.value["value"] for line in lines}
    assert value["global_batch_size"] == 200 and value["seed"] == 0 and value["submission_benchmark"] == "task2a"
    accuracies = [line.value["value"] for line in lines if line.key == "eval_accuracy"]
    assert accuracies[-1] == run.result["final_accuracy"]

"""`mlbench compare | charts | prices` and the --repeat/--format options, on recorded runs.

Usage errors are one line on stderr and exit code 2, never a traceback.
"""

import json

import pytest
from click.testing import CliRunner

import mlbench.cli.commands  # noqa: F401  (registers the commands)
from mlbench.cli import cli
from mlbench.network.settings import NetworkSettings
from mlbench.results.store import RunStore

from tests.results.recorded import record_run


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def assert_usage_error(result, text):
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and text in lines[0]
    assert "Traceback" not in result.output


@pytest.fixture
def store():
    return RunStore()


@pytest.fixture
def scaling(store):
    runs = []
    for k, times in {1: [100.0, 110.0, 120.0], 2: [50.0, None, 60.0]}.items():
        runs += [record_run(store, workers=k, tta=t, wall=None if t is None else t + 10, seed=i,
                            group_id="g7") for i, t in enumerate(times)]
    return runs


def test_compare_prints_one_row_per_worker_count_with_the_known_answers(scaling):
    result = invoke("compare", "--group", "g7", "--instance", "n1-standard-4")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "task1a | closed division | centralized-sgd | Test CPU (8 cores) | goal test accuracy >= 80.00%" in out
    row1 = next(line.split() for line in out.splitlines() if line.startswith("1 "))
    row2 = next(line.split() for line in out.splitlines() if line.startswith("2 "))
    # workers, converged, median, range, 95% interval (from 5 converged repeats), speedup, efficiency
    assert row1[:7] == ["1", "3/3", "0:01:50", "0:01:40..0:02:00", "-", "1.00x", "100%"]
    # the missed run: "not reached" at the slow end
    assert row2[:8] == ["2", "2/3", "0:01:00", "50.0s..not", "reached", "-", "1.83x", "92%"]
    # cost to accuracy: median wall time (120 s, 70 s) x 1 node x $0.19/h
    assert row1[-1] == "$0.0063" and row2[-1] == "$0.0037"
    assert "at $0.19 per node-hour" in out


def test_compare_refuses_runs_of_different_tasks(store):
    a = record_run(store, workers=1, tta=1.0, wall=2.0)
    b = record_run(store, workers=1, task="task2a", tta=1.0, wall=2.0)
    assert_usage_error(invoke("compare", a.id, b.id), "different tasks")


def test_an_unknown_run_id_is_one_line(store):
    assert_usage_error(invoke("compare", "zzzz"), "no run 'zzzz'")
    assert_usage_error(invoke("charts", "zzzz"), "no run 'zzzz'")


def test_charts_without_a_finished_run_is_one_line(store, tmp_path):
    failed = record_run(store, workers=2, state="failed")
    assert_usage_error(invoke("charts", failed.id, "--out-dir", tmp_path / "c"), "no finished run")
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("args, text", [
    (("compare", "--task", "task1a", "--instance", "n1-standard-4", "--price-per-hour", "1"), "not both"),
    (("compare", "--task", "task1a", "--price-per-hour", "-1"), "USD >= 0"),
    (("compare", "--task", "task1a", "--prices", "p.csv"), "--instance"),
    (("compare", "--task", "task1a", "--instance", "no-such-box"), "no price for 'no-such-box'"),
    (("compare",), "say which runs"),
    (("charts", "--task", "task1a", "--format", "gif"), "choose from png, svg, pdf"),
    (("run", "task2a", "1", "--repeat", "0"), "--repeat must be at least 1"),
    (("run", "task2a", "1", "--repeat", "2", "--name", "x"), "--name names one run"),
])
def test_usage_errors_are_one_line_with_exit_code_2(args, text):
    assert_usage_error(invoke(*args), text)


def test_charts_write_the_four_figures_even_when_no_run_reached_its_goal(store, tmp_path):
    runs = [record_run(store, workers=k, tta=None) for k in (1, 2)]
    result = invoke("charts", *(r.id for r in runs), "--out-dir", tmp_path, "--format", "png")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "task1a-communication.png", "task1a-cost.png", "task1a-loss-accuracy.png", "task1a-speedup.png"]


def test_charts_of_twelve_families_are_written(store, tmp_path):
    """Twelve optimizers' families on 1 and 2 workers: every figure is written (test_charts.py
    measures their legends, titles and colours)."""
    from mlbench.results.compare import compare_runs

    runs = [record_run(store, workers=k, tta=5.0 / k, optimizer=f"optimizer-{i}") for i in range(12) for k in (1, 2)]
    assert len(compare_runs(runs).families()) == 12
    result = invoke("charts", *(r.id for r in runs), "--out-dir", tmp_path, "--format", "png")
    assert result.exit_code == 0, result.output
    assert len(list(tmp_path.iterdir())) == 4


def test_charts_take_the_folder_as_out_dir_and_the_old_o_with_a_deprecation_line(store, tmp_path):
    runs = [record_run(store, workers=k, tta=5.0 / k) for k in (1, 2)]
    short = invoke("charts", *(r.id for r in runs), "-d", tmp_path / "d", "--format", "svg")
    assert short.exit_code == 0 and short.stderr == "", short.output
    old = invoke("charts", *(r.id for r in runs), "-o", tmp_path / "o", "--format", "svg")
    assert old.exit_code == 0, old.output
    assert old.stderr == (f"Warning: `charts -o DIR` is deprecated (-o is an output format elsewhere); "
                          f"use --out-dir {tmp_path / 'o'} or -d {tmp_path / 'o'}.\n")
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == sorted(p.name for p in (tmp_path / "d").iterdir())
    assert len(list((tmp_path / "o").iterdir())) == 4
    assert_usage_error(invoke("charts", runs[0].id, "-o", tmp_path / "x", "-d", tmp_path / "y"),
                       "-o/--output is the old spelling of --out-dir/-d: give one of them")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_charts_add_the_network_figure_for_runs_at_several_bandwidths(store, tmp_path):
    runs = [record_run(store, workers=k, tta=tta, network=NetworkSettings(rate).to_dict())
            for rate, tta in ((1e8, 12.0), (1e9, 8.0)) for k in (1, 2)]
    result = invoke("charts", *(r.id for r in runs), "--out-dir", tmp_path, "--format", "png")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "task1a-network.png").stat().st_size > 0


def test_prices_lists_the_table_with_the_original_figures():
    out = invoke("prices").stdout
    assert "n1-standard-4:preemptible" in out and "0.04" in out and "nvidia-tesla-k80:preemptible" in out


def test_compare_shows_goodput_restarts_and_lost_steps_when_a_run_had_faults(store):
    kills = "kill:rank=1,every=90s"
    clean = record_run(store, workers=2, tta=50.0, wall=60.0)
    faulty = record_run(store, workers=2, tta=10.0, wall=20.0, inject=(kills,), on_failure="restart",
                        restarts=({"lost_steps": 7},))
    result = invoke("compare", clean.id, faulty.id)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "GOODPUT    RESTARTS    STEPS LOST" in result.output
    heading = next(i for i, line in enumerate(lines) if f"inject {kills}; on failure restart:3 |" in line)
    row = lines[heading + 3].split()   # heading, column names, rule, the row of 2 workers
    assert row[0] == "2" and row[-3:] == ["60.6%", "1", "7"]   # 10 s of training in 16.5 s
    assert any("| no faults |" in line for line in lines)

    data = json.loads(invoke("compare", clean.id, faulty.id, "-o", "json").output)
    by_faults = {f["faults"]: f["groups"][0] for f in data["families"]}
    assert set(by_faults) == {None, f"inject {kills}; on failure restart:3"}
    assert by_faults[f"inject {kills}; on failure restart:3"]["restarts"] == 1
    assert by_faults[f"inject {kills}; on failure restart:3"]["lost_steps"] == 7
    assert by_faults[None]["goodput"] == 10 / 16.5

    assert "GOODPUT" not in invoke("compare", clean.id).output


def test_charts_draw_the_fault_timeline_of_runs_with_faults(store, tmp_path):
    from mlbench.results.charts import fault_chart, fault_timeline
    from mlbench.results.compare import compare_runs

    clean = record_run(store, workers=2, tta=50.0, wall=60.0)
    faulty = record_run(store, workers=2, tta=None, train_time=60.0, inject=("kill:rank=1,every=30s",),
                        on_failure="restart", restarts=({"lost_steps": 7, "recovered_s": 2.5}, {"lost_steps": 3}))
    comparison = compare_runs([clean, faulty])
    [run] = [r for g in comparison.groups for r in g.runs if r.had_faults]
    timeline = fault_timeline(run)
    # wall seconds from the workers' start (T0 - 5): losses logged at T0 + 30 and T0 + 60
    assert timeline.loss == [(35.0, 2.0), (65.0, 1.0)]
    assert timeline.faults == [(30.0, "kill of rank 1", False), (60.0, "kill of rank 1", False)]
    assert timeline.restarts == [(30.5, 2.5), (60.5, None)]
    figure = fault_chart(comparison)
    [ax] = figure.axes
    assert [t.get_text().strip() for t in ax.texts] == ["kill of rank 1", "kill of rank 1"]
    assert ax.get_title() == f"run {faulty.id}, 2 workers: goodput 90.2%, 2 restarts, 10 steps lost"

    result = invoke("charts", clean.id, faulty.id, "--out-dir", tmp_path, "--format", "svg")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "task1a-faults.svg").stat().st_size > 0
    plain = invoke("charts", clean.id, "--out-dir", tmp_path / "plain", "--format", "svg")
    assert plain.exit_code == 0 and not (tmp_path / "plain" / "task1a-faults.svg").exists()


@pytest.mark.parametrize("state", ["cancelled", "failed"])
@pytest.mark.parametrize("task,final,cell", [("task1a", 0.6782, "67.82%"), ("task3a", 915.69, "ppl 915.69"),
                                             ("task4b", 21.3, "BLEU 21.30")])
def test_a_run_that_ended_without_a_result_shows_how_far_it_got_on_every_surface(store, state, task, final, cell):
    """A cancelled or failed run has no result, but its events say how far it got: the epoch and
    the goal metric's last value are in the status table, `status -o json`, `status RUN`, the
    Python API and the dashboard alike (they once said '-' everywhere but `status RUN`)."""
    from mlbench import api
    from tests.launcher_matrix import dashboard

    run = record_run(store, workers=2, task=task, tta=None, final=final, state=state)
    assert run.result is None
    listed = json.loads(invoke("status", "-o", "json").stdout)["runs"][0]
    detail = json.loads(invoke("status", run.id, "-o", "json").stdout)
    for row in (listed, detail, api.get(run.id).to_dict()):
        assert (row["state"], row["epoch"], row["metric_value"], row["metric_text"]) == (state, 1.0, final, cell)
        assert row["time_to_accuracy"] is None and row["goal_reached"] is None
    table = invoke("status").stdout.splitlines()
    row = next(line for line in table if line.startswith(run.id))
    assert " 1.00 " in row and cell in row, table
    with dashboard() as served:
        runs = served.call("GET", "/api/runs")["runs"]
        shown = next(r for r in runs if r["id"] == run.id)
        assert (shown["epoch"], shown["metric_value"], shown["metric_text"]) == (1.0, final, cell)
        page = served.call("GET", f"/api/runs/{run.id}")["run"]
        assert (page["epoch"], page["metric_value"]) == (1.0, final)


def test_the_status_table_tells_a_missed_goal_from_no_goal_and_from_a_run_still_going():
    from mlbench.cli.format import time_to_goal_cell

    row = {"time_to_accuracy": None, "goal": 0.8, "state": "finished"}
    assert time_to_goal_cell(row) == "not reached"
    assert time_to_goal_cell({**row, "state": "failed"}) == "not reached"
    assert time_to_goal_cell({**row, "goal": None}) == "no goal"          # synthetic data, task 0a
    assert time_to_goal_cell({**row, "state": "running"}) == "-"
    assert time_to_goal_cell({**row, "time_to_accuracy": 61.0, "state": "finished"}) == "0:01:01"


def test_status_shows_each_runs_network_in_its_table_and_its_json(store):
    shaped = record_run(store, workers=2, tta=5.0, network=NetworkSettings(10e6).to_dict())
    plain = record_run(store, workers=2, tta=5.0, seed=1)
    table = invoke("status").output.splitlines()
    assert table[0].split()[:6] == ["ID", "NAME", "TASK", "FRAMEWORK", "WORKERS", "NETWORK"]
    cells = {line.split()[0]: line.split("  ") for line in table[2:]}
    assert any(c.strip() == "10 Mbit/s" for c in cells[shaped.id]), cells
    runs = {r["id"]: r for r in json.loads(invoke("status", "-o", "json").output)["runs"]}
    assert (runs[shaped.id]["network"], runs[plain.id]["network"]) == ("10 Mbit/s", None)

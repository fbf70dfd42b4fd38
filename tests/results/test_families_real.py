"""Real runs that differ in one computing option land in separate families on every surface:
`mlbench compare` (its table and -o json) and the dashboard's compare document name the
difference; runs on the tests' own data are open division and say why."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

import mlbench
import mlbench.cli.commands
from mlbench.cli import cli
from mlbench.dashboard.views import comparison_document as dashboard_document
from mlbench.results.compare import comparison_of
from mlbench.results.store import RunStore

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory, libsvm_dir):
    """Three 1-worker runs of task2a on the LIBSVM fixture: as specified, with --set momentum=0.5,
    and with two threads per worker."""
    home = tmp_path_factory.mktemp("families") / "home"
    common = dict(data_dir=str(libsvm_dir), light=True, log_every=5, home=home)
    runs = [mlbench.run("task2a", 1, **common),
            mlbench.run("task2a", 1, overrides={"momentum": 0.5}, **common),
            mlbench.run("task2a", 1, threads_per_worker=2, **common)]
    assert [r.state for r in runs] == ["finished"] * 3
    return home, runs


def test_runs_that_differ_in_one_option_are_three_families_and_every_surface_says_in_what(three_runs, monkeypatch):
    home, _runs = three_runs
    monkeypatch.setenv("MLBENCH_HOME", str(home))
    result = CliRunner().invoke(cli, ["compare", "--task", "task2a"])
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    match = re.fullmatch(r"The 3 families differ in: set\.momentum \((.*)\); threads_per_worker \((.*)\)\.", first)
    assert match, first
    momentum, threads = (group.split(" | ") for group in match.groups())
    assert sorted(zip(momentum, threads)) == [("0", "1"), ("0", "2"), ("0.5", "1")]
    document = json.loads(CliRunner().invoke(cli, ["compare", "--task", "task2a", "-o", "json"]).stdout)
    assert len(document["families"]) == 3
    assert {d["key"] for d in document["differences"]} == {"set.momentum", "threads_per_worker"}
    board = dashboard_document(comparison_of(RunStore(home), task="task2a"))
    assert board["differences"] == [first] and len({f["heading"] for f in board["families"]}) == 3
    pooled = comparison_of(RunStore(home), task="task2a", pool=("set.momentum", "threads_per_worker"))
    assert len(pooled.families()) == 1 and pooled.groups[0].time_to_accuracy.runs == 3


def test_a_run_on_the_tests_data_is_open_and_records_what_data_it_was(three_runs):
    _, runs = three_runs
    plain = runs[0]
    assert plain.division == "open" and plain.open_reasons == ["data small, not epsilon"]
    assert plain.division_text == "open: data small, not epsilon"
    data = json.loads((plain.run_dir / "run.json").read_text())["data"]
    assert data["official"] is False and data["rows"] == {"train": 2000, "test": 500} and len(data["sha256"]) == 64
    # the same bytes give the same identity: the three runs share their data
    assert len({json.loads((r.run_dir / "run.json").read_text())["data"]["sha256"] for r in runs}) == 1
    assert runs[1].open_reasons == ["momentum=0.5", "data small, not epsilon"]

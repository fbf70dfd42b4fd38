"""Runs share a family of `compare` only when everything that changes what they compute is equal:
each pair below differs in one computing setting and must land in two families, with the
configuration diff naming that setting; settings that only watch a run (its name, how often it
logs, the watchdog) and the seed never split a family; ``--pool KEY`` joins across a key on
purpose and says so."""

from __future__ import annotations

import dataclasses

import pytest

from mlbench.errors import UsageError
from mlbench.results.charts import family_labels
from mlbench.results.compare import compare_runs
from mlbench.results.report import difference_lines, family_heading
from mlbench.results.store import RunStore
from mlbench.run_config import CONFIG_ROLES, RunConfig
from mlbench.tasks.records import spec_to_dict
from mlbench.tasks.registry import TASKS
from tests.results.recorded import record_run

EPSILON = {"dataset": "epsilon", "official": True, "reason": None, "rows": {"train": 400000, "test": 100000},
           "features": 2000, "files": [], "sha256": "a" * 64}
SMALL = {**EPSILON, "official": False, "reason": "3,000 training rows, not epsilon's 400,000",
         "rows": {"train": 3000, "test": 1000}, "sha256": "b" * 64}
OTHER = {**SMALL, "reason": "1,200 training rows, not epsilon's 400,000", "sha256": "c" * 64}


@pytest.fixture
def store(isolated_home):
    return RunStore()


def _spec_with(**settings):
    spec = spec_to_dict(TASKS["task2a"])
    spec["settings"].update(settings)
    return spec


#: (what differs, the base run's extras, the other run's extras, the fingerprint key named)
PAIRS = [
    ("optimizer option", dict(config={"optimizer": "local-sgd", "optimizer_options": {"period": "1"}}),
     dict(config={"optimizer": "local-sgd", "optimizer_options": {"period": "8"}}), "opt.period"),
    ("--set", dict(), dict(config={"task": _spec_with(momentum=0.9)}), "set.momentum"),
    ("data", dict(document={"data": SMALL}), dict(document={"data": OTHER}), "data"),
    ("official against custom data", dict(document={"data": EPSILON}), dict(document={"data": SMALL}), "data"),
    ("--no-stop", dict(), dict(config={"stop_at_goal": False}), "stop"),
    ("--time-budget", dict(), dict(config={"time_budget_s": 300.0}), "stop"),
    ("--max-steps", dict(), dict(config={"max_steps": 100}), "stop"),
    ("checkpoint interval", dict(config={"checkpoint_every_steps": 100}),
     dict(config={"checkpoint_every_steps": 10}), "checkpoint_every"),
    ("resumed against clean", dict(), dict(document={"resumes": [{"from_step": 20, "at": 1.0}]}), "resumed"),
    ("threads per worker", dict(config={"threads_per_worker": 1}), dict(config={"threads_per_worker": 2}),
     "threads_per_worker"),
    ("precision", dict(), dict(config={"precision": "bf16"}), "precision"),
    ("backend", dict(), dict(config={"backend": "mpi"}), "backend"),
    ("light goal", dict(), dict(config={"light": True}), "stop"),
    ("plug-in source", dict(config={"model_plugin": {"name": "m", "sha256": "1" * 64}}),
     dict(config={"model_plugin": {"name": "m", "sha256": "2" * 64}}), "model.sha256"),
]


@pytest.mark.parametrize("what, base, other, key", PAIRS, ids=[p[0] for p in PAIRS])
def test_two_runs_that_differ_in_one_computing_setting_never_share_a_family(store, what, base, other, key):
    runs = [record_run(store, task="task2a", workers=1, tta=100.0, wall=110.0, **base),
            record_run(store, task="task2a", workers=1, tta=50.0, wall=55.0, **other)]
    comparison = compare_runs(runs)
    assert len(comparison.families()) == 2, what
    differences = dict(comparison.differences())
    assert key in differences, (what, differences)
    line = difference_lines(comparison)[0]
    assert line.startswith("The 2 families differ in: ") and key in line
    headings = [family_heading(f, differing=tuple(differences)) for f in comparison.families()]
    assert len(set(headings)) == 2, headings  # every table says which one it is
    legends = family_labels(list(comparison.families()))
    assert len(set(legends.values())) == 2, legends  # and every figure's legend


def test_repeats_that_differ_only_in_the_seed_and_in_what_watches_them_share_a_family(store):
    runs = [record_run(store, task="task2a", workers=1, tta=100.0, wall=110.0, seed=0, document={"data": EPSILON}),
            record_run(store, task="task2a", workers=1, tta=90.0, wall=99.0, seed=1, document={"data": EPSILON},
                       config={"log_every": 5, "watchdog_s": None, "timing": False, "save_model": True,
                               "data_dir": "/elsewhere"})]  # the same data in another folder
    comparison = compare_runs(runs)
    [(_family, [group])] = comparison.families().items()
    assert group.time_to_accuracy.runs == 2 and comparison.differences() == []
    assert difference_lines(comparison) == []


def test_pooling_across_a_setting_is_deliberate_and_said(store):
    runs = [record_run(store, task="task2a", workers=1, tta=100.0, wall=110.0, document={"data": SMALL}),
            record_run(store, task="task2a", workers=1, tta=90.0, wall=99.0, document={"data": OTHER})]
    pooled = compare_runs(runs, pool=("data",))
    [(family, [group])] = pooled.families().items()
    assert group.time_to_accuracy.runs == 2
    assert difference_lines(pooled) == ["Pooled on purpose (--pool): runs that differ in data share a row."]
    assert family_heading(family, pooled=pooled.pooled).endswith(" | pooled across data")
    with pytest.raises(UsageError, match="--pool dat: no run compared has that setting"):
        compare_runs(runs, pool=("dat",))
    assert len(compare_runs(runs, pool=("set.",)).families()) == 2  # pooling the task's settings leaves data apart


def test_every_field_of_a_run_config_says_whether_it_changes_what_the_run_computes():
    assert set(CONFIG_ROLES) == {f.name for f in dataclasses.fields(RunConfig)}
    assert set(CONFIG_ROLES.values()) <= {"computes", "watches", "seed", "workers", "runtime"}

"""The new-run form's checks: the sentences `mlbench run` prints, placed beside their field, and
nothing recorded when any worker count is wrong (no browser, no worker process)."""

from __future__ import annotations

import pytest

from mlbench.dashboard.newrun import FormError, create_runs
from mlbench.dashboard.sources import Sources
from mlbench.results.store import RunStore


def refused(form: dict) -> dict[str, str]:
    store = RunStore()
    with pytest.raises(FormError) as err:
        create_runs(Sources(store), {"task": "task2a", "workers": "1", **form})
    assert store.list() == []  # nothing recorded
    return err.value.errors


@pytest.mark.parametrize("form, field, sentence", [
    ({"task": "task9"}, "task", "unknown task 'task9'; choose one of: "),
    ({"workers": "1 0"}, "workers", "the number of workers must be at least 1, not 0"),
    ({"workers": "two"}, "workers", "'two' is not a valid integer"),
    ({"time_budget": "soon"}, "time_budget", "invalid duration 'soon'; use e.g. 90s, 10m, 1h30m"),
    ({"overrides": "speed=3"}, "overrides", "--set 'speed=3': expected KEY=VALUE with KEY one of "),
    ({"max_steps": "0"}, "max_steps", "--max-steps must be at least 1"),
    ({"workers": "2 100000"}, "workers", "100000 workers: this machine can start at most"),
    ({"overrides": "batch_per_worker=0"}, "overrides", "--set batch_per_worker=0: must be at least 1"),
    ({"optimizer": "powersgd", "optimizer_options": {"rank": "x"}}, "optimizer_options.rank",
     "option rank=x: expected an integer"),
    ({"optimizer": "adamw"}, "optimizer", "unknown optimizer 'adamw'; choose one of: "),
    ({"data_dir": "/no/such/folder"}, "data_dir", "--data-dir /no/such/folder: no such folder"),
    ({"seed": "99999999999999999999"}, "seed", "--seed 99999999999999999999: give a whole number from 0 to "),
    ({"seed": "-3"}, "seed", "--seed -3: give a whole number from 0 to 9223372036854775807"),
    ({"where": "mars"}, "where", "where 'mars': runs can be started on 'local'"),
    ({"where": "cluster"}, "where", "where 'cluster': runs can be started on 'local'"),
    ({"optimizer": "powersgd", "optimizer_options": "rank=2"}, "optimizer_options",
     "optimizer_options 'rank=2': send the optimizer's options "),
])
def test_a_wrong_field_is_refused_with_the_cli_sentence_beside_it(form, field, sentence, libsvm_dir):
    form.setdefault("data_dir", str(libsvm_dir))
    errors = refused(form)
    assert list(errors) == [field] and errors[field].startswith(sentence)


def test_a_topology_that_does_not_fit_one_of_the_worker_counts_records_no_run(libsvm_dir):
    errors = refused({"workers": "4 2", "optimizer": "decentralized-sgd",
                      "optimizer_options": {"topology": "torus:2x2"}, "data_dir": str(libsvm_dir)})
    assert errors == {"optimizer_options.topology": "topology torus:2x2 has 4 nodes, but the run has 2 workers"}


def test_the_form_offers_every_task_with_its_goal_metric():
    from mlbench.dashboard.newrun import form_choices

    tasks = {t["name"]: t for t in form_choices(Sources(RunStore()))["tasks"]}
    assert list(tasks) == ["task0a", "task1a", "task2a", "task3a", "task4b", "task5a"]
    assert tasks["task0a"]["goal_full"] is None and tasks["task0a"]["kind"] == "allreduce"
    assert (tasks["task3a"]["metric"], tasks["task3a"]["goal_full"]) == ("perplexity", 70.0)
    assert (tasks["task4b"]["metric"], tasks["task4b"]["goal_light"]) == ("bleu", 20.0)
    assert (tasks["task5a"]["metric"], tasks["task5a"]["goal_full"]) == ("val_loss", 3.28)

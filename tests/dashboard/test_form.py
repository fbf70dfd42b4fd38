"""The new-run form's checks: the sentences `mlbench run` prints, placed beside their field, and
nothing recorded when any worker count is wrong (no browser, no worker process)."""

from __future__ import annotations

import pytest

from mlbench.dashboard.newrun import FormError, create_runs, form_fields
from mlbench.launch.options import RUN_OPTIONS
from mlbench.dashboard.sources import Sources
from mlbench.results.store import RunStore
from mlbench.run_config import RunDocument


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
    ({"overrides": "speed=3"}, "overrides", "--set 'speed=3': no task has a setting 'speed'"),
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
    # the fields made from the options' declaration (new.js), each refused beside itself
    ({"log_every": "0"}, "log_every", "--log-every must be at least 1"),
    ({"log_every": "often"}, "log_every", "'often' is not a valid integer"),
    ({"repeat": "0"}, "repeat", "--repeat must be at least 1, not 0"),
    ({"framework": "caffe"}, "framework", "--framework caffe: choose one of pytorch, jax, tensorflow"),
    ({"bandwidth": "fast"}, "bandwidth", "--bandwidth 'fast': expected a number and a unit"),
    ({"latency": "soon"}, "latency", "--latency 'soon': expected a number and a unit"),
    ({"jitter": "x", "latency": "1ms"}, "jitter", "--jitter 'x': expected a number and a unit"),
    ({"loss": "lots"}, "loss", "--loss 'lots': expected a percentage"),
    ({"inject": "boom:rank=0"}, "inject", "--inject boom:rank=0: the kind is one of kill, stall, slow"),
    ({"max_size": "big"}, "max_size", "'big' is not a number"),
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


def test_the_form_offers_every_declared_option_but_how_the_cli_follows_its_runs():
    """/api/form's fields are RUN_OPTIONS themselves (new.js draws a field for each that
    new.html does not lay out): a newly declared option is in the form without a change here."""
    fields = {f["name"]: f for f in form_fields()}
    assert list(fields) == [o.name for o in RUN_OPTIONS if o.name not in ("detach", "log_to")]
    assert fields["framework"]["choices"] == ["pytorch", "jax", "tensorflow"]
    assert (fields["framework"]["default"], fields["framework"]["own_field"]) == ("pytorch", False)
    assert (fields["repeat"]["kind"], fields["repeat"]["default"]) == ("int", 1)
    assert fields["inject"]["multiple"] and fields["timing"]["negated"] and fields["timing"]["label"] == "No timing"
    assert fields["seed"]["own_field"] and fields["optimizer_options"]["own_field"]


def test_the_declared_fields_make_the_runs_the_cli_would(libsvm_dir):
    """Repeats, the log interval, the framework and faults from the form's fields: planned as
    `mlbench run task2a 1 --repeat 2 --log-every 5 --framework pytorch --inject ...` plans them."""
    store = RunStore()
    _, records = create_runs(Sources(store), {
        "task": "task2a", "workers": "1", "data_dir": str(libsvm_dir), "repeat": "2", "log_every": "5",
        "framework": "pytorch", "inject": "kill:rank=0,at=30s\nslow:rank=0,at=1s,factor=2", "timing": False,
        "bandwidth": "", "name": ""})
    assert [r.seed for r in records] == [0, 1] and len({r.group_id for r in records}) == 1
    config = RunDocument.load(records[0].run_dir).config
    assert (config.log_every, config.framework, config.timing) == (5, "pytorch", False)
    assert [fault["kind"] for fault in config.faults] == ["kill", "slow"]

"""The library path of a run without a terminal: planning runs, the run document, goal metrics
with a direction, results read through TrainingResult, and task settings in the spec."""

import dataclasses

import pytest

from mlbench.errors import UsageError
from mlbench.launch.plan import RunRequest, build_config
from mlbench.launch.session import EXIT_CANCELLED, EXIT_FAILED, EXIT_OK, Outcome, plan_runs
from mlbench.results.outcome import TrainingResult
from mlbench.results.store import RunStore
from mlbench.run_config import RunDocument
from mlbench.tasks.metrics import get_metric
from mlbench.tasks.overrides import parse_overrides, resolve
from mlbench.tasks.task3a import TASK3A
from mlbench.tasks.task4b import TASK4B


def test_runs_are_planned_in_rounds_over_the_worker_counts_with_one_group_and_a_seed_per_round():
    plan = plan_runs(RunRequest(task="task2a", workers=1, seed=7), [1, 2, 4], repeat=2)
    assert [(r.workers, r.seed) for r in plan.requests] == [(1, 7), (2, 7), (4, 7), (1, 8), (2, 8), (4, 8)]
    assert plan.group_id and {r.group_id for r in plan.requests} == {plan.group_id}
    single = plan_runs(RunRequest(task="task2a", workers=1), [2])
    assert single.group_id is None and single.requests[0].workers == 2


@pytest.mark.parametrize("counts, repeat, name, detach, message", [
    ([0], 1, None, False, "the number of workers must be at least 1, not 0"),
    ([2], 0, None, False, "--repeat must be at least 1, not 0"),
    ([1, 2], 1, "x", False, "--name names one run"),
    ([2], 2, None, True, "--detach starts one run"),
])
def test_a_plan_that_cannot_run_is_refused_in_one_sentence(counts, repeat, name, detach, message):
    with pytest.raises(UsageError, match=message):
        plan_runs(RunRequest(task="task2a", workers=1, name=name), counts, repeat, detach=detach)


def test_the_exit_code_says_how_the_runs_ended():
    store = RunStore()
    made = [store.create(task="task2a", workers=1, division="closed", run_json={"task": "task2a"})
            for _ in range(3)]
    states = [dataclasses.replace(made[0], state="finished"), dataclasses.replace(made[1], state="failed"),
              dataclasses.replace(made[2], state="cancelled")]
    assert Outcome(states[:1]).exit_code == EXIT_OK
    assert Outcome(states[:2]).exit_code == EXIT_FAILED
    assert Outcome(states).exit_code == EXIT_CANCELLED


def test_the_run_document_keeps_sections_it_does_not_own(tmp_path):
    config, _ = build_config(RunRequest(task="task2a", workers=2, data="synthetic"))
    document = RunDocument(task="task2a", config=config, division="open", changed=["data=synthetic"],
                           extra={"network": {"bandwidth_bps": 1e9}})
    document.save(tmp_path)
    loaded = RunDocument.load(tmp_path)
    assert loaded.extra == {"network": {"bandwidth_bps": 1e9}}
    assert loaded.config == config and loaded.division == "open"
    assert loaded.to_dict() == document.to_dict()


def test_perplexity_is_reached_from_above_and_bleu_from_below():
    perplexity, bleu, accuracy = get_metric("perplexity"), get_metric("bleu"), get_metric("accuracy")
    assert perplexity.reached(69.9, 70) and not perplexity.reached(70.1, 70)
    assert bleu.reached(25.0, 25) and not bleu.reached(24.9, 25)
    assert accuracy.best([0.5, 0.7, 0.6]) == 0.7 and perplexity.best([90.0, 71.0, 80.0]) == 71.0
    assert accuracy.format(0.8) == "80.00%" and perplexity.format(70) == "70.00"


def test_the_result_sentence_names_the_tasks_metric():
    result = TrainingResult.from_dict({"goal": 90.0, "reached": False, "metric": "perplexity",
                                       "final_accuracy": 120.5, "best_accuracy": 118.25, "train_time": 300.0,
                                       "epochs": 1.5, "steps": 100, "stop_reason": "time-budget"})
    assert result is not None
    assert result.sentence() == ("Goal validation perplexity <= 90.00 not reached (time-budget): 120.50 after "
                                 "0:05:00 of training (best 118.25, 1.50 epochs).")
    assert TrainingResult.from_dict({"kind": "allreduce", "rows": []}) is None


def test_a_tasks_own_setting_is_changed_with_set_extra_and_makes_the_run_open():
    spec, changed = resolve(TASK3A, parse_overrides(["extra.hidden=64", "extra.dropout=0.4"]))
    assert spec.settings.hidden == 64 and changed == ["extra.hidden"]
    with pytest.raises(UsageError, match="task3a has no setting 'width'"):
        resolve(TASK3A, parse_overrides(["extra.width=3"]))
    with pytest.raises(UsageError, match="expected a int"):
        resolve(TASK3A, parse_overrides(["extra.hidden=big"]))


def test_task4b_runs_closed_with_adam_and_open_with_sgd():
    config, changed = build_config(RunRequest(task="task4b", workers=2))
    assert config.optimizer == "centralized-adam" and changed == []
    config, changed = build_config(RunRequest(task="task4b", workers=2, optimizer="centralized-sgd"))
    assert changed == ["optimizer=centralized-sgd"]
    assert TASK4B.settings.optimizer_values() == {"beta1": 0.9, "beta2": 0.98, "eps": 1e-9, "lr_scale": 1.0}

"""Closed division means the specification, and every surface says why a run is open; compare
flags what makes its rows unfair to compare (oversubscribed cores, a busy machine, threads that
differ, a superlinear speedup) and which families cannot be told apart at their n."""

from __future__ import annotations

import pytest

from mlbench.results.compare import compare_runs
from mlbench.results.division import run_division
from mlbench.results.fairness import fairness_notes, group_flags
from mlbench.results.report import comparison_document, run_overview
from mlbench.results.store import RunStore
from mlbench.run_config import RunDocument
from tests.results.recorded import ENVIRONMENT, record_run

IDLE = {**ENVIRONMENT, "cores": 2, "load_average": [0.1, 0.1, 0.1]}


@pytest.fixture
def store(isolated_home):
    return RunStore()


def test_a_run_that_shrank_is_open_and_says_so(store):
    run = record_run(store, task="task2a", workers=2, tta=50.0, wall=55.0, on_failure="shrink",
                     restarts=({"workers": 1, "lost_steps": 3},))
    division = run_division(run)
    assert (division.name, division.reasons) == ("open", ("workers 2 -> 1 (shrank)",))
    row = run_overview(run)
    assert (row["division"], row["division_text"]) == ("open", "open: workers 2 -> 1 (shrank)")
    assert run_division(record_run(store, task="task2a", workers=2, tta=50.0, wall=55.0)).text == "closed"


def test_a_run_on_custom_data_is_open_with_the_reason_the_data_gave(store):
    data = {"dataset": "epsilon", "official": False, "reason": "3,000 training rows, not epsilon's 400,000",
            "rows": {}, "features": 20, "files": [], "sha256": "b" * 64}
    run = record_run(store, task="task2a", workers=1, tta=5.0, wall=6.0, division="open",
                     document={"data": data, "changed": [f"data {data['reason']}", "momentum=0.9"]})
    assert run_overview(run)["division_text"] == "open: data 3,000 training rows, not epsilon's 400,000; momentum=0.9"


def _scaling(store, *, threads=(1, 1), cores=2, load=(0.1, 0.1), tta=(100.0, 50.0)):
    runs = []
    for workers, t, lo, seconds in zip((1, 2), threads, load, tta):
        environment = {**IDLE, "cores": cores, "load_average": [lo, lo, lo], "threads_per_worker": t}
        runs.append(record_run(store, task="task2a", workers=workers, tta=seconds, wall=seconds + 1,
                               environment=environment, config={"threads_per_worker": t},
                               result_extra={"load_average_end": [lo, lo, lo]}))
    return compare_runs(runs)


def test_a_fair_scaling_study_carries_no_flag(store):
    comparison = _scaling(store)
    assert all(group_flags(g) == [] for g in comparison.groups) and fairness_notes(comparison) == []


def test_oversubscribed_cores_are_flagged(store):
    comparison = _scaling(store, threads=(2, 2))   # 2 workers x 2 threads on 2 cores
    two = next(g for g in comparison.groups if g.workers == 2)
    assert group_flags(two) == ["oversubscribed"]
    assert any(note.startswith("Oversubscribed: 2 workers x 2 threads > 2 cores")
               for note in fairness_notes(comparison))


def test_a_run_made_on_a_busy_machine_is_marked(store):
    comparison = _scaling(store, load=(6.0, 0.1))   # the 1-worker run: a load of 6 beside it on 2 cores
    one = next(g for g in comparison.groups if g.workers == 1)
    assert group_flags(one) == ["busy 1/1"]
    assert any("Busy machine, 1 worker:" in note and one.runs[0].record.id in note
               for note in fairness_notes(comparison))
    assert comparison_document(comparison)["families"][0]["groups"][0]["flags"] == ["busy 1/1"]


def test_a_superlinear_efficiency_is_said_with_its_likely_cause(store):
    # the 2-worker run is 4x faster than the 1-worker run: 200% efficiency, relative to a busy base
    comparison = _scaling(store, load=(6.0, 0.1), tta=(100.0, 25.0))
    two = next(g for g in comparison.groups if g.workers == 2)
    assert two.efficiency == pytest.approx(2.0) and "superlinear" in group_flags(two)
    [note] = [n for n in fairness_notes(comparison) if n.startswith("Superlinear")]
    assert "200% efficiency at 2 workers" in note and "made on a busy machine" in note


def test_threads_that_differ_within_a_pooled_family_are_flagged_and_named_as_the_cause(store):
    runs = [record_run(store, task="task2a", workers=1, tta=100.0, wall=101.0, config={"threads_per_worker": 2},
                       environment={**IDLE, "threads_per_worker": 2}),
            record_run(store, task="task2a", workers=2, tta=20.0, wall=21.0, config={"threads_per_worker": 1},
                       environment={**IDLE, "threads_per_worker": 1})]
    assert len(compare_runs(runs).families()) == 2   # never one family unless pooled
    pooled = compare_runs(runs, pool=("threads_per_worker",))
    [note] = [n for n in fairness_notes(pooled) if n.startswith("Superlinear")]
    assert "threads per worker differ (2 at 1 against 1 at 2)" in note


def test_families_whose_ranges_overlap_are_indistinguishable_at_their_n(store):
    def family(period: str, times: tuple[float, ...]):
        return [record_run(store, task="task2a", workers=2, tta=t, wall=t + 1, seed=i,
                           config={"optimizer": "local-sgd", "optimizer_options": {"period": period}})
                for i, t in enumerate(times)]
    overlapping = compare_runs(family("1", (50.0, 60.0)) + family("8", (55.0, 70.0)))
    assert any(n == "Indistinguishable at 2 workers: opt.period 1 (n=2) and opt.period 8 (n=2); their ranges "
                    "of time to goal overlap." for n in fairness_notes(overlapping))
    apart = compare_runs(family("1", (50.0, 60.0)) + family("4", (80.0, 90.0)))
    assert not any(n.startswith("Indistinguishable") for n in fairness_notes(apart))


def test_families_of_other_optimizers_are_named_by_the_optimizer_not_by_its_options(store):
    runs = [record_run(store, task="task2a", workers=2, tta=t, wall=t + 1, seed=i,
                       config={"optimizer": optimizer, "optimizer_options": options})
            for optimizer, options, times in (("centralized-sgd", {}, (50.0, 60.0)),
                                              ("diloco", {"H": "10", "outer_lr": "0.7"}, (55.0, 70.0)))
            for i, t in enumerate(times)]
    [note] = [n for n in fairness_notes(compare_runs(runs)) if n.startswith("Indistinguishable")]
    named = ("optimizer centralized-sgd (n=2)", "optimizer diloco (n=2)")
    assert note in (f"Indistinguishable at 2 workers: {a} and {b}; their ranges of time to goal overlap."
                    for a, b in (named, named[::-1]))


def test_the_mlperf_score_is_the_mean_without_the_fastest_and_slowest_of_five(store):
    runs = [record_run(store, task="task2a", workers=1, tta=t, wall=t + 1, seed=i)
            for i, t in enumerate((10.0, 11.0, 12.0, 13.0, 20.0))]
    comparison = compare_runs(runs, score="mlperf")
    [_group] = comparison.groups
    stats = comparison_document(comparison)["families"][0]["groups"][0]["time_to_accuracy"]
    assert stats["mlperf_score"] == pytest.approx(12.0) and stats["n"] == 5
    assert stats["interval95"] is not None and stats["interval95"][0] < stats["median"] < stats["interval95"][1]
    assert comparison_document(comparison)["score"] == "mlperf"
    with pytest.raises(Exception, match="--score best: choose median or mlperf"):
        compare_runs(runs, score="best")


def test_a_step_cap_given_at_resume_makes_the_run_open_from_then(store):
    run = record_run(store, task="task2a", workers=1, tta=5.0, wall=6.0)
    assert run_division(run).text == "closed"
    document = RunDocument.load(run.run_dir)
    document.config.max_steps = 60                     # `mlbench resume RUN --max-steps 60`
    document.save(run.run_dir)
    assert run_division(run).text == "open: stop: --max-steps 60"
    document.config.max_steps, document.config.stop_at_goal = None, False
    document.save(run.run_dir)
    assert run_division(run).reasons == ("stop: --no-stop (trains on after the goal)",)


def test_the_previous_run_of_a_sweep_in_the_load_average_does_not_make_the_next_one_busy(store):
    # a load of 3.5 on 2 cores a minute after a 4-worker run, but only the run itself runnable now
    after = {**IDLE, "load_average": [3.5, 2.6, 3.3], "runnable": 2, "threads_per_worker": 1}
    run = record_run(store, task="task2a", workers=1, tta=40.0, wall=41.0, environment=after,
                     result_extra={"load_average_end": [2.0, 2.0, 3.0], "runnable_end": 1})
    assert group_flags(compare_runs([run]).groups[0]) == []
    crowded = {**after, "runnable": 4}   # two other tasks runnable beside the run's own
    run = record_run(store, task="task2a", workers=1, tta=40.0, wall=41.0, environment=crowded)
    assert group_flags(compare_runs([run]).groups[0]) == ["busy 1/1"]


def test_the_runnable_tasks_are_read_from_the_kernel():
    from mlbench.results.environment import runnable_tasks

    count = runnable_tasks(samples=3, interval_s=0.0)
    assert isinstance(count, int) and count >= 1   # this thread, at least

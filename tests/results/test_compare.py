"""compare on recorded runs: grouping, repeats, speedup, efficiency, compute/communication, cost."""

import math

import pytest

from mlbench.errors import RunNotFound, UsageError
from mlbench.results.compare import (
    THROUGHPUT,
    TIME_TO_ACCURACY,
    compare_runs,
    hardware_label,
    select_runs,
)
from mlbench.results.store import RunStore
from tests.results.recorded import record_run

# time to accuracy of the repeats per worker count (None: the goal was missed)
REPEATS = {1: [100.0, 130.0, 110.0, 90.0, 200.0], 2: [50.0, None, 60.0], 4: [30.0, 40.0, 35.0]}


@pytest.fixture
def store():
    return RunStore()


@pytest.fixture
def scaling(store):
    """Closed-division task1a runs: 5 x 1 worker, 3 x 2 workers (one missed), 3 x 4 workers."""
    return [record_run(store, workers=k, tta=t, wall=None if t is None else t + 10, seed=i,
                       communication=tuple(1.0 + 2 * r for r in range(k)))
            for k, times in REPEATS.items() for i, t in enumerate(times)]


def groups_by_workers(comparison):
    return {g.workers: g for g in comparison.groups}


def test_repeats_are_summarised_per_worker_count(scaling):
    g = groups_by_workers(compare_runs(scaling))
    assert [g[k].time_to_accuracy.runs for k in (1, 2, 4)] == [5, 3, 3]
    assert g[1].time_to_accuracy.median == 110 and g[1].time_to_accuracy.olympic_mean == pytest.approx(340 / 3)
    assert g[2].time_to_accuracy.converged == 2 and g[2].time_to_accuracy.median == 60
    assert math.isinf(g[2].time_to_accuracy.maximum)
    assert g[4].time_to_accuracy.median == 35 and g[4].time_to_accuracy.olympic_mean == 35


def test_speedup_and_efficiency_are_relative_to_the_fewest_workers(scaling):
    g = groups_by_workers(compare_runs(scaling))
    assert g[1].speedup == 1.0 and g[1].efficiency == 1.0
    assert g[2].speedup == pytest.approx(110 / 60) and g[2].efficiency == pytest.approx(110 / 120)
    # the missed run makes the slow end of the range 0: it never reached the goal
    assert g[2].speedup_range == (0.0, pytest.approx(110 / 50))
    assert g[4].speedup == pytest.approx(110 / 35) and g[4].efficiency == pytest.approx(110 / 140)
    assert g[4].speedup_range == (pytest.approx(110 / 40), pytest.approx(110 / 30))


def test_speedup_base_is_the_smallest_worker_count_present(store):
    runs = [record_run(store, workers=2, tta=80.0, wall=90.0), record_run(store, workers=8, tta=25.0, wall=30.0)]
    g = groups_by_workers(compare_runs(runs))
    assert g[2].speedup == 1.0
    assert g[8].speedup == pytest.approx(3.2) and g[8].efficiency == pytest.approx(0.8)


def test_compute_and_communication_add_up_every_worker_of_every_run(scaling):
    g = groups_by_workers(compare_runs(scaling))
    # each rank computes 7 s; rank r communicates 1 + 2r s
    assert g[1].compute_seconds == pytest.approx(5 * 7) and g[1].communication_seconds == pytest.approx(5 * 1)
    assert g[4].compute_seconds == pytest.approx(3 * 4 * 7)
    assert g[4].communication_seconds == pytest.approx(3 * (1 + 3 + 5 + 7))
    assert g[4].communication_share == pytest.approx(48 / (84 + 48))


def test_cost_is_the_wall_time_to_the_goal_at_the_given_price(scaling):
    g = groups_by_workers(compare_runs(scaling, usd_per_node_hour=0.19))
    # a local run occupies this one machine: 1 node; wall time = tta + 10 s
    assert g[1].cost.median == pytest.approx(120 * 0.19 / 3600)
    assert g[2].cost.converged == 2 and g[2].cost.median == pytest.approx(70 * 0.19 / 3600)


def test_local_runs_cost_nothing_without_a_price(scaling):
    g = groups_by_workers(compare_runs(scaling))
    assert g[1].cost.median == 0.0


def test_a_cluster_run_pays_for_one_node_per_worker(store):
    run = record_run(store, workers=4, tta=90.0, wall=100.0, launcher="kubernetes")
    [group] = compare_runs([run], usd_per_node_hour=0.19).groups
    assert group.cost.median == pytest.approx(4 * 100 * 0.19 / 3600)
    [unpriced] = compare_runs([run]).groups
    assert unpriced.cost is None


@pytest.mark.parametrize("launcher, nodes", [("kubernetes", 2), ("external", 1), ("slurm", 3)])
def test_a_run_pays_for_the_nodes_its_launcher_recorded(store, launcher, nodes):
    """8 pods on 2 nodes, or an 8-process torchrun on one machine, are not 8 machines."""
    run = record_run(store, workers=8, tta=90.0, wall=100.0, launcher=launcher, nodes=nodes,
                     on_this_machine=False)
    [group] = compare_runs([run], usd_per_node_hour=0.19).groups
    assert group.cost.median == pytest.approx(nodes * 100 * 0.19 / 3600)
    assert compare_runs([run]).groups[0].cost is None  # not this machine: no price, no cost


def test_only_like_is_compared_with_like(store):
    runs = [record_run(store, workers=1, tta=100.0, wall=110.0),
            record_run(store, workers=2, tta=60.0, wall=70.0),
            record_run(store, workers=2, tta=40.0, wall=50.0, division="open", optimizer="powersgd"),
            record_run(store, workers=2, tta=30.0, wall=35.0, goal=0.7)]
    families = compare_runs(runs).families()
    assert len(families) == 3
    sizes = sorted(len(groups) for groups in families.values())
    assert sizes == [1, 1, 2]
    # alone in its family, the open run is its own base
    open_group = next(gs[0] for f, gs in families.items() if f.division == "open")
    assert open_group.speedup == 1.0


def test_without_a_goal_runs_are_compared_by_throughput(store):
    runs = [record_run(store, workers=1, goal=None, division="open", samples_per_rank=1000),
            record_run(store, workers=2, goal=None, division="open", samples_per_rank=900)]
    comparison = compare_runs(runs)
    [family] = comparison.families()
    assert family.metric == THROUGHPUT
    g = groups_by_workers(comparison)
    # 1000 samples in 10 s vs 2 x 900 samples in 10 s
    assert g[1].throughput.median == 100 and g[2].throughput.median == 180
    assert g[2].speedup == pytest.approx(1.8) and g[2].efficiency == pytest.approx(0.9)
    assert g[2].cost.converged == 0


def test_runs_of_different_tasks_are_refused(store):
    runs = [record_run(store, workers=1, tta=1.0, wall=2.0),
            record_run(store, workers=1, task="task2a", tta=1.0, wall=2.0)]
    with pytest.raises(UsageError, match="different tasks"):
        compare_runs(runs)


def test_unfinished_runs_are_left_out_and_listed(store):
    done = record_run(store, workers=1, tta=10.0, wall=11.0)
    failed = record_run(store, workers=2, state="failed")
    comparison = compare_runs([done, failed])
    assert [r.id for r in comparison.skipped] == [failed.id]
    assert [g.workers for g in comparison.groups] == [1]
    with pytest.raises(UsageError, match="no finished run"):
        compare_runs([failed])


def test_selection_by_task_by_group_and_by_id(store):
    a = record_run(store, workers=1, tta=1.0, wall=2.0, group_id="g1")
    b = record_run(store, workers=2, tta=1.0, wall=2.0, group_id="g1")
    c = record_run(store, workers=1, task="task2a", tta=1.0, wall=2.0)
    assert [r.id for r in select_runs(store, task="task1a")] == [a.id, b.id]
    assert [r.id for r in select_runs(store, group="g1")] == [a.id, b.id]
    assert [r.id for r in select_runs(store, (c.id,))] == [c.id]
    with pytest.raises(RunNotFound):
        select_runs(store, ("nope",))
    with pytest.raises(UsageError, match="unknown task"):
        select_runs(store, task="task9")
    with pytest.raises(UsageError, match="no runs of group zz"):
        select_runs(store, group="zz")
    with pytest.raises(UsageError, match="not both"):
        select_runs(store, (a.id,), task="task1a")


def test_hardware_is_the_gpu_model_on_cuda_and_the_cpu_otherwise():
    env = {"cpu": "AMD EPYC", "cores": 2, "gpus": ["NVIDIA H100 80GB HBM3"]}
    assert hardware_label("cuda", env) == "NVIDIA H100 80GB HBM3"
    assert hardware_label("cpu", env) == "AMD EPYC (2 cores)"


def test_time_to_accuracy_families_say_so(scaling):
    [family] = compare_runs(scaling).families()
    assert family.metric == TIME_TO_ACCURACY and family.goal == 0.8 and family.hardware == "Test CPU (8 cores)"


KILLS = "kill:rank=1,every=90s"
RESTART_FAMILY = f"inject {KILLS}; on failure restart:3"


@pytest.fixture
def faulty(store):
    """task1a on 2 workers: 2 clean repeats; 2 under kills with restarts (1 restart losing 7
    steps, 2 losing 3 + 5); 1 under the same kills failing on a failure; 1 without faults but
    ready to restart. Wall = train time + 6.5 s (recorded.py), so goodput = T / (T + 6.5)."""
    return {
        "clean": [record_run(store, workers=2, tta=50.0, wall=60.0, seed=i) for i in range(2)],
        "restart": [record_run(store, workers=2, tta=t, wall=t + 10, seed=i, train_time=t, inject=(KILLS,),
                               on_failure="restart", restarts=r)
                    for i, (t, r) in enumerate([(10.0, ({"lost_steps": 7},)),
                                                (20.0, ({"lost_steps": 3}, {"lost_steps": 5}))])],
        "fail": [record_run(store, workers=2, tta=40.0, wall=50.0, inject=(KILLS,))],
        "ready": [record_run(store, workers=2, tta=45.0, wall=55.0, on_failure="restart:2")],
    }


def test_fault_schedules_and_policies_are_families_of_their_own_with_their_goodput(faulty):
    comparison = compare_runs([run for runs in faulty.values() for run in runs])
    families = {f.faults: groups for f, groups in comparison.families().items()}
    assert sorted(families) == ["", f"inject {KILLS}; on failure fail", RESTART_FAMILY,
                                "no faults injected; on failure restart:2"]
    assert all(len(groups) == 1 and groups[0].speedup == 1.0 for groups in families.values())
    [restarted] = families[RESTART_FAMILY]
    assert [run.record.id for run in restarted.runs] == [run.id for run in faulty["restart"]]
    assert restarted.goodput == (10 / 16.5 + 20 / 26.5) / 2
    assert (restarted.restarts, restarted.lost_steps, restarted.had_faults) == (1.5, 7.5, True)
    # summed over the two repeats: each second weighs the same (goodput of the sums)
    totals = restarted.fault_totals
    assert (totals["runs"], totals["restarts"], totals["redone_steps"]) == (2, 3, 15)
    assert (totals["wall_s"], totals["productive_s"]) == (16.5 + 26.5, 30.0)
    assert totals["goodput"] == pytest.approx(30 / 43) != restarted.goodput
    from mlbench.results.report import comparison_document as cli_document, compare_notes
    assert any(note.startswith("2 worker(s), " + RESTART_FAMILY + ", summed over its 2 repeats: goodput 69.8% "
                               "(30.0 s productive of 43.0 s wall), 3 restarts, 15 steps redone")
               for note in compare_notes(comparison)), compare_notes(comparison)
    grouped = {f["faults"]: f for f in cli_document(comparison)["families"]}
    assert grouped[RESTART_FAMILY]["groups"][0]["fault_totals"] == totals
    [clean] = families[""]
    assert clean.goodput == 10 / 16.5
    assert (clean.restarts, clean.lost_steps, clean.had_faults) == (0, 0, False)
    assert families["no faults injected; on failure restart:2"][0].had_faults is False

    from mlbench.dashboard.views import comparison_document   # the dashboard's compare page
    document = comparison_document(comparison)
    assert document["headers"][-3:] == ["GOODPUT", "RESTARTS", "STEPS LOST"]
    shown = {f["faults"]: f for f in document["families"]}
    assert shown[RESTART_FAMILY]["groups"][0]["row"][-3:] == ["68.0%", "1.5", "7.5"]
    assert shown[None]["groups"][0]["row"][-3:] == ["60.6%", "0", "0"]
    assert RESTART_FAMILY in shown[RESTART_FAMILY]["heading"] and "| no faults |" in shown[None]["heading"]
    assert any(note.startswith("Goodput: ") for note in document["notes"])

    plain = comparison_document(compare_runs(faulty["clean"] + faulty["ready"]))
    assert "GOODPUT" not in plain["headers"] and not any("faults" in f["heading"] for f in plain["families"])

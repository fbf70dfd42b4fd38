"""Task specs, overrides and the division, learning-rate values at the documented points."""

import pytest

from mlbench.errors import UsageError
from mlbench.launch.plan import RunRequest, build_config, parse_duration
from mlbench.tasks.classification import learning_rate
from mlbench.tasks.overrides import parse_overrides, resolve
from mlbench.tasks.records import spec_from_dict, spec_to_dict
from mlbench.tasks.registry import get_task
from mlbench.tasks.task1a import TASK1A
from mlbench.tasks.task2a import TASK2A


def lr1a(step, workers=4, spe=100):
    return learning_rate(TASK1A.lr, workers=workers, batch_per_worker=32, step=step, steps_per_epoch=spe)


def test_task1a_warmup_starts_at_eta_b_and_reaches_eta_b_k_after_5_epochs():
    assert lr1a(0) == pytest.approx(0.1 / 256 * 32)
    assert lr1a(250) == pytest.approx(0.0125 + (0.05 - 0.0125) * 0.5)
    assert lr1a(500) == pytest.approx(0.1 / 256 * 32 * 4)
    assert lr1a(8199) == pytest.approx(0.05)


def test_task1a_rate_divided_by_10_at_epochs_82_and_109():
    assert lr1a(8200) == pytest.approx(0.005)
    assert lr1a(10899) == pytest.approx(0.005)
    assert lr1a(10900) == pytest.approx(0.0005)
    assert lr1a(16399) == pytest.approx(0.0005)


def test_task1a_single_worker_has_no_warmup_ramp():
    assert lr1a(0, workers=1) == lr1a(300, workers=1) == pytest.approx(0.0125)


@pytest.mark.parametrize("workers,alpha", [(1, 200), (2, 400), (3, 400), (4, 600), (8, 700), (16, 800),
                                           (32, 800), (64, 800)])
def test_task2a_inverse_sqrt_with_alpha_by_worker_count(workers, alpha):
    lr = lambda step: learning_rate(TASK2A.lr, workers=workers, batch_per_worker=100, step=step,
                                    steps_per_epoch=10)
    assert lr(0) == pytest.approx(alpha)
    assert lr(3) == pytest.approx(alpha / 2)
    assert lr(99) == pytest.approx(alpha / 10)


def test_closed_division_values_match_the_spec():
    assert (TASK1A.batch_per_worker, TASK1A.momentum, TASK1A.nesterov, TASK1A.weight_decay) == (32, 0.9, True, 1e-4)
    assert (TASK1A.max_epochs, TASK1A.goal_full, TASK1A.goal_light, TASK1A.model) == (164, 0.80, 0.70, "resnet20-v1")
    assert (TASK2A.batch_per_worker, TASK2A.momentum, TASK2A.weight_decay, TASK2A.l2) == (100, 0.0, 0.0, 2.5e-6)
    assert (TASK2A.goal_full, TASK2A.goal_light) == (0.89, 0.80)


def test_overrides_mark_changed_values_and_leave_equal_ones_closed():
    spec, changed = resolve(TASK1A, parse_overrides(["momentum=0.9", "lr.milestones=50,75"]))
    assert changed == ["lr.milestones"]
    assert spec.lr.milestones == (50, 75) and spec.momentum == 0.9
    spec, changed = resolve(TASK1A, {"model": "resnet20"})
    assert changed == [] and spec.model == "resnet20-v1"
    spec, changed = resolve(TASK2A, parse_overrides(["lr.alpha=50"]))
    assert changed == ["lr.alpha"] and spec.lr.alpha(8) == 50


def test_spec_round_trips_through_json_dict():
    for task in (TASK1A, TASK2A):
        assert spec_from_dict(spec_to_dict(task)) == task


@pytest.mark.parametrize("bad", ["momentum", "nope=1", "momentum=fast", "nesterov=maybe", "max_epochs=1.5"])
def test_bad_overrides_are_usage_errors(bad):
    with pytest.raises(UsageError):
        parse_overrides([bad])


def test_unknown_task_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown task 'task9'"):
        get_task("task9")


def test_model_override_and_division():
    config, changed = build_config(RunRequest(task="task1a", workers=2, model="resnet56-v2"))
    assert config.task.model == "resnet56-v2" and changed == ["model=resnet56-v2"]
    config, changed = build_config(RunRequest(task="task1a", workers=2, device="cpu"))
    assert changed == [] and config.backend == "gloo" and config.device == "cpu"
    with pytest.raises(UsageError, match="does not fit"):
        build_config(RunRequest(task="task2a", workers=1, model="resnet20-v1"))
    with pytest.raises(UsageError, match="at least 1"):
        build_config(RunRequest(task="task1a", workers=0))


@pytest.mark.parametrize("text,seconds", [("90", 90), ("90s", 90), ("10m", 600), ("1h30m", 5400), ("2h", 7200),
                                          ("1.5m", 90)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "10x", "0", "-5m"])
def test_bad_durations(text):
    with pytest.raises(UsageError):
        parse_duration(text)


@pytest.mark.parametrize("gpus", [1, 2])
def test_more_local_workers_than_gpus_default_to_gloo_and_refuse_nccl(monkeypatch, gpus):
    """NCCL refuses two ranks on one GPU: with more workers than this machine's GPUs the default
    is gloo, and an explicit --backend nccl is a usage error naming the GPUs. The GPU count is
    this machine's (patched here on a machine without GPUs; real on the device machine)."""
    import mlbench.launch.plan as plan

    monkeypatch.setattr(plan, "cuda_available", lambda: True)
    monkeypatch.setattr(plan, "cuda_device_count", lambda: gpus)
    fits, _ = build_config(RunRequest(task="task2a", workers=gpus, device="cuda", data="synthetic"))
    assert (fits.device, fits.backend) == ("cuda", "nccl")
    shared, _ = build_config(RunRequest(task="task2a", workers=gpus + 1, device="cuda", data="synthetic"))
    assert (shared.device, shared.backend) == ("cuda", "gloo")
    refusal = rf"{gpus + 1} workers on this machine's {gpus} GPU.*NCCL needs a GPU per worker"
    with pytest.raises(UsageError, match=refusal):
        build_config(RunRequest(task="task2a", workers=gpus + 1, device="cuda", backend="nccl", data="synthetic"))


@pytest.mark.parametrize("name", ["task1a", "task2a", "task3a", "task4b", "task5a"])
def test_each_tasks_light_goal_is_strictly_easier_than_its_full_one(name):
    """`--light` is the quick check of a task: a goal the curve reaches earlier, in the metric's
    direction (task 5a's: llm.c's published curve at step 2,000, 3.8585, over the full 3.28)."""
    from mlbench.tasks.metrics import get_metric

    spec = get_task(name)
    metric = get_metric(spec.metric)
    assert spec.goal_light != spec.goal_full
    assert metric.reached(spec.goal_full, spec.goal_light) and not metric.reached(spec.goal_light, spec.goal_full)

"""What a task tells its optimizer, as numbers (mlbench.optim.hyper), and the absolute rate ``--opt lr=``.

In the test process alone: one worker, no group.
"""

from __future__ import annotations

import types

import pytest
import torch

from mlbench.checks.optimizer import LR, bed_hyper
from mlbench.errors import UsageError
from mlbench.optim.base import OptimizerContext, flat_params
from mlbench.optim.catalog import build_optimizer
from mlbench.optim.descriptors import INFO
from mlbench.optim.hyper import Hyper
from mlbench.results.fingerprint import optimizer_settings
from mlbench.tasks.classification import learning_rate
from mlbench.tasks.task1a import TASK1A
from mlbench.tasks.task2a import TASK2A
from mlbench.tasks.task3a import TASK3A
from mlbench.tasks.task4b import TASK4B
from mlbench.tasks.task5a import TASK5A
from mlbench.timing import PhaseTimer
from mlbench.worker.hyper import task_hyper


def test_the_worker_hands_the_optimizers_the_tasks_numbers():
    s = TASK1A.settings
    assert task_hyper(TASK1A, 4) == Hyper(momentum=0.9, nesterov=True, weight_decay=1e-4,
                                          peak_lr=s.lr.eta_per_sample * s.batch_per_worker * 4)
    adam = task_hyper(TASK4B, 8)
    assert (adam.reference, adam.betas, adam.eps, adam.lr_scale) == ("centralized-adam", (0.9, 0.98), 1e-9, 1.0)
    assert adam.reference_options() == TASK4B.settings.optimizer_values()
    adamw = task_hyper(TASK5A, 2)
    assert (adamw.reference, adamw.betas, adamw.weight_decay, adamw.peak_lr) == ("centralized-adamw", (0.9, 0.95),
                                                                                 0.1, 6e-4)
    assert task_hyper(TASK2A, 1).reference_options() == {}


@pytest.mark.parametrize("workers", [1, 2, 4, 16])
def test_each_tasks_peak_rate_is_the_top_of_its_schedule(workers):
    for spec in (TASK1A, TASK2A):
        s = spec.settings
        rates = [learning_rate(s.lr, workers=workers, batch_per_worker=s.batch_per_worker, step=step,
                               steps_per_epoch=10) for step in range(0, 2000, 7)]
        assert max(rates) == pytest.approx(s.peak_lr(workers), rel=1e-12)
    gpt = TASK5A.settings
    assert max(gpt.learning_rate(step) for step in range(0, gpt.steps, 13)) <= gpt.peak_lr(workers)
    assert gpt.learning_rate(gpt.warmup_steps - 1) == gpt.peak_lr(workers)
    assert TASK4B.settings.peak_lr(workers) == TASK4B.settings.lr
    assert TASK3A.settings.peak_lr(workers) == pytest.approx(TASK3A.settings.lr * workers ** 0.5)


def test_an_absolute_rate_keeps_the_schedules_shape_with_its_own_peak():
    hyper = Hyper(peak_lr=0.4)
    assert hyper.rate_factor({"lr": None, "lr_scale": 0.08}) == 0.08
    assert hyper.rate_factor({"lr": 0.1}) == 0.25
    assert hyper.rate_factor({"inner_lr": 0.2, "inner_lr_scale": 0.08}, lr="inner_lr", scale="inner_lr_scale") == 0.5
    with pytest.raises(UsageError, match="this task's rate has none"):
        Hyper(peak_lr=0.0).rate_factor({"lr": 0.1})


@pytest.mark.parametrize("name,rate,scale", [("centralized-adam", "lr", "lr_scale"),
                                             ("centralized-adamw", "lr", "lr_scale"),
                                             ("signsgd", "lr", "lr_scale"),
                                             ("diloco", "inner_lr", "inner_lr_scale")])
def test_an_absolute_rate_replaces_the_scale_which_is_then_refused(name, rate, scale):
    info = INFO[name]
    assert info.parse_options({}, 2)[rate] is None
    values = info.parse_options({rate: "1e-3"}, 2)
    assert values[rate] == 1e-3 and scale not in values
    with pytest.raises(UsageError, match=rf"option {scale} changes nothing once {rate} is set"):
        info.parse_options({rate: "1e-3", scale: "0.5"}, 2)
    assert scale not in info.parse_options({rate: "1e-3", scale: "0.5"}, None, strict=False)   # a record read back


def test_diloco_takes_an_absolute_inner_rate_with_adamw_only():
    with pytest.raises(UsageError, match="option inner_lr applies with inner=adamw only"):
        INFO["diloco"].parse_options({"inner": "sgd", "inner_lr": "1e-3"}, 2)


def test_the_fingerprint_tells_an_absolute_rate_apart_and_a_default_scale_not():
    def fingerprint(options):
        config = types.SimpleNamespace(optimizer="centralized-adam", optimizer_options=options, optimizer_plugin=None)
        return optimizer_settings(config)

    assert fingerprint({}) == fingerprint({"lr_scale": "0.08"})
    assert fingerprint({})["opt.lr"] == "-"
    absolute = fingerprint({"lr": "0.001"})
    assert absolute["opt.lr"] == "0.001" and "opt.lr_scale" not in absolute
    assert absolute != fingerprint({"lr": "0.002"})


def _trained(name: str, options: dict[str, str], hyper: Hyper, steps: int = 5) -> torch.Tensor:
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3).double()
    opt = build_optimizer(name, OptimizerContext(model=model, hyper=hyper, world_size=1, rank=0,
                                                 timer=PhaseTimer(torch.device("cpu"), enabled=False),
                                                 options=options))
    x = torch.randn(32, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for step in range(steps):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step(hyper.peak_lr / (step + 1))
    return flat_params(list(model.parameters())).detach()


@pytest.mark.parametrize("name,scale", [("centralized-adam", 0.08), ("centralized-adamw", 0.08), ("signsgd", 0.01)])
def test_an_absolute_rate_of_scale_times_peak_steps_as_the_scale_does(name, scale):
    hyper = task_hyper(TASK1A, 1)
    by_scale = _trained(name, {}, hyper)
    by_rate = _trained(name, {"lr": repr(scale * hyper.peak_lr)}, hyper)
    assert torch.allclose(by_scale, by_rate, rtol=1e-12, atol=1e-15)
    assert not torch.equal(by_scale, _trained(name, {"lr": repr(2 * scale * hyper.peak_lr)}, hyper))


def test_an_absolute_rate_is_the_same_step_on_every_task():
    """The point of ``lr``: one value means one step size, whatever the task's own rate (a
    scale of it does not: task 2a's peak is 200, task 1a's 0.0125 on one worker)."""
    steps = [_trained("signsgd", {"lr": "0.001"}, Hyper(peak_lr=task_hyper(spec, 1).peak_lr), steps=1)
             for spec in (TASK1A, TASK2A)]
    assert torch.allclose(steps[0], steps[1], rtol=1e-12, atol=0)


def test_the_checks_test_bed_takes_task_1a_numbers_at_its_own_constant_rate():
    assert bed_hyper() == Hyper(momentum=0.9, nesterov=True, weight_decay=1e-4, peak_lr=LR)

"""The training loop in one process (no process group): what it evaluates and when."""

from mlbench.results.events import EventWriter
from mlbench.run_config import RunConfig
from mlbench.tasks.overrides import resolve
from mlbench.tasks.task2a import TASK2A
from mlbench.worker.trainer import Trainer
from tests.helpers import ListSink


def test_a_step_cap_at_an_epoch_boundary_evaluates_the_model_once():
    spec, _ = resolve(TASK2A, {"batch_per_worker": 10_000})  # synthetic epsilon: 4 steps an epoch
    sink = ListSink()
    trainer = Trainer(RunConfig(task=spec, workers=1, data="synthetic", max_steps=4, log_every=4),
                      0, EventWriter(sink, 0))
    trainer.setup()
    assert trainer.steps_per_epoch == 4
    result = trainer.train()
    assert (result.stop_reason, result.steps) == ("max-steps", 4)
    evals = [e for e in sink.events if e["name"] == "eval/accuracy"]
    assert [e["step"] for e in evals] == [4]
    assert len([e for e in sink.events if e["name"] == "time/eval"]) == 1


def test_parameters_that_turn_non_finite_in_the_last_step_fail_the_run_before_evaluation():
    """The losses of an interval are all finite, but its last update left a non-finite weight
    (here written by the test into the real model): the check at the interval's end fails the
    run instead of evaluating, and recording, a broken model."""
    import math

    import pytest
    import torch

    from mlbench.errors import DivergedError

    spec, _ = resolve(TASK2A, {"batch_per_worker": 10_000})
    sink = ListSink()
    trainer = Trainer(RunConfig(task=spec, workers=1, data="synthetic", max_steps=3, log_every=3),
                      0, EventWriter(sink, 0))
    trainer.setup()
    train_step = trainer.runtime.train_step

    def step_then_break(batch, lr, optimizer):
        loss = train_step(batch, lr, optimizer)
        if trainer.progress.step == 2:  # the third step (progress counts it after it returns)
            with torch.no_grad():
                next(trainer.model.parameters()).view(-1)[7] = math.nan
        return loss

    trainer.runtime.train_step = step_then_break
    with pytest.raises(DivergedError, match=r"^the model's parameters on rank 0 are not finite after step 3 "):
        trainer.train()
    assert not [e for e in sink.events if e["name"] in ("train/loss", "eval/accuracy")]

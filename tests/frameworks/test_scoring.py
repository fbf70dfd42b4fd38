"""One evaluation for all frameworks: mlbench's NumPy scorer, and the PyTorch worker using it.

The scorer's numbers are checked against values worked out by hand; the PyTorch runtime's
evaluation must be exactly the scorer's verdict on its model's logits (so a JAX port, handing
over the same logits, is scored the same).
"""

import math

import numpy as np
import pytest
import torch

from mlbench.results.events import EventWriter
from mlbench.run_config import RunConfig
from mlbench.tasks.losses import regulariser
from mlbench.tasks.overrides import resolve
from mlbench.tasks.scoring import metrics_of, score_outputs
from mlbench.tasks.task2a import TASK2A
from mlbench.worker.trainer import Trainer
from tests.helpers import ListSink


def test_logistic_scores_by_hand():
    totals = score_outputs("logistic", np.array([0.0, 2.0, -1.0], np.float32), np.array([1.0, -1.0, -1.0]))
    # a logit of 0 predicts +1: right, wrong, right
    expected_loss = math.log(2) + math.log1p(math.exp(2)) + math.log1p(math.exp(-1))
    assert totals.tolist() == pytest.approx([expected_loss, 2.0, 3.0], rel=1e-15)


def test_cross_entropy_scores_by_hand_and_a_tie_goes_to_the_first_class():
    totals = score_outputs("cross-entropy", np.array([[1.0, 1.0], [0.0, 2.0]]), np.array([1, 1]))
    expected_loss = math.log(2) + math.log1p(math.exp(-2))
    assert totals.tolist() == pytest.approx([expected_loss, 1.0, 2.0], rel=1e-15)
    assert metrics_of(totals, 0.5) == pytest.approx({"loss": expected_loss / 2 + 0.5, "accuracy": 0.5})


def test_the_scorer_refuses_outputs_that_do_not_match_the_labels():
    with pytest.raises(ValueError, match="3 outputs for 2 labels"):
        score_outputs("logistic", np.zeros(3), np.ones(2))
    with pytest.raises(ValueError, match="no scorer for the loss 'hinge'"):
        score_outputs("hinge", np.zeros(2), np.ones(2))


def test_the_pytorch_evaluation_is_the_scorers_verdict_on_its_logits():
    spec, _ = resolve(TASK2A, {"batch_per_worker": 10_000, "l2": 0.01})
    trainer = Trainer(RunConfig(task=spec, workers=1, data="synthetic", max_steps=2, log_every=2),
                      0, EventWriter(ListSink(), 0))
    trainer.setup()
    trainer.train()   # weights away from zero, so that the logits differ from sample to sample
    runtime = trainer.runtime
    x, y = runtime.data.test_batch(0, runtime.data.num_test)
    with torch.no_grad():
        logits = runtime.model(x).numpy()
        expected = metrics_of(score_outputs("logistic", logits, y.numpy()),
                              float(regulariser(runtime.model, 0.01)))
    assert runtime.evaluate() == expected

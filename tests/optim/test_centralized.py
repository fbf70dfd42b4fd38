"""Exactness of the all-reduce methods on real gloo processes: each equals a known reference.

k workers with minibatch b see exactly the samples one process with batch k*b sees, so
synchronous methods must produce that process's parameters (up to float rounding), and the two
aggregation modes (one message, one per tensor) must produce the same bits.
"""

from __future__ import annotations

import pytest
import torch

from mlbench.optim.base import OptimizerContext
from mlbench.optim.catalog import build_optimizer
from mlbench.tasks.task1a import TASK1A
from mlbench.tasks.task5a import TASK5A
from mlbench.timing import PhaseTimer
from mlbench.worker.hyper import task_hyper
from tests.optim.support import PLAIN, loss_on, params_of, run_on_ranks, tiny_data, tiny_model

WORLD, BATCH = 2, 4
LRS = (0.1, 0.05, 0.2, 0.1)

RUNS = {
    "sgd-model": ("centralized-sgd", {"by": "model"}, TASK1A),
    "sgd-layer": ("centralized-sgd", {"by": "layer"}, TASK1A),
    "adam-model": ("centralized-adam", {"by": "model"}, TASK1A),
    "adam-layer": ("centralized-adam", {"by": "layer"}, TASK1A),
    "adamw-model": ("centralized-adamw", {"by": "model"}, TASK5A),
    "adamw-all": ("centralized-adamw", {"decay": "all"}, TASK5A),
    "plain-sgd": ("centralized-sgd", {}, PLAIN),
    "plain-averaging": ("model-averaging", {}, PLAIN),
    "plain-averaging-by-layer": ("model-averaging", {"by": "layer"}, PLAIN),
    "ddp": ("ddp", {}, TASK1A),
}


def train_tiny(rank: int, world: int, runs: dict) -> dict[str, list[list[torch.Tensor]]]:
    """Each run trains a fresh tiny model on this rank's share; the parameters after every step."""
    x, y = tiny_data(len(LRS) * world * BATCH)
    history = {}
    for key, (name, options, spec) in runs.items():
        model = tiny_model()
        ctx = OptimizerContext(model=model, hyper=task_hyper(spec, world), world_size=world, rank=rank,
                               timer=PhaseTimer(torch.device("cpu")), options=options)
        opt = build_optimizer(name, ctx)
        history[key] = []
        for t, lr in enumerate(LRS):
            lo = (t * world + rank) * BATCH
            opt.zero_grad()
            loss_on(opt.module, x[lo:lo + BATCH], y[lo:lo + BATCH]).backward()
            opt.step(lr)
            history[key].append(params_of(model))
    return history


def one_process(make_optimizer, lr_scale: float = 1.0) -> list[list[torch.Tensor]]:
    """The reference: one process, batch WORLD*BATCH, a torch optimizer."""
    x, y = tiny_data(len(LRS) * WORLD * BATCH)
    model = tiny_model()
    opt = make_optimizer(model.parameters())
    history = []
    for t, lr in enumerate(LRS):
        for group in opt.param_groups:
            group["lr"] = lr * lr_scale
        lo, hi = t * WORLD * BATCH, (t + 1) * WORLD * BATCH
        opt.zero_grad()
        loss_on(model, x[lo:hi], y[lo:hi]).backward()
        opt.step()
        history.append(params_of(model))
    return history


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return run_on_ranks(train_tiny, WORLD, RUNS, store_dir=str(tmp_path_factory.mktemp("ranks")))


def assert_close(a: list[torch.Tensor], b: list[torch.Tensor], atol: float = 1e-6) -> None:
    for ta, tb in zip(a, b, strict=True):
        torch.testing.assert_close(ta, tb, atol=atol, rtol=1e-5)


def sgd_reference(spec):
    return one_process(lambda ps: torch.optim.SGD(ps, lr=0.0, momentum=spec.momentum,
                                                  nesterov=spec.nesterov, weight_decay=spec.weight_decay))


def test_all_ranks_end_with_the_same_model(trained):
    for key in RUNS:
        assert_close(trained[0][key][-1], trained[1][key][-1], atol=0)


def test_centralized_sgd_by_model_and_by_layer_give_identical_parameters(trained):
    for rank in range(WORLD):
        for a, b in zip(trained[rank]["sgd-model"], trained[rank]["sgd-layer"]):
            assert all(torch.equal(ta, tb) for ta, tb in zip(a, b))


def test_centralized_sgd_equals_one_process_with_batch_k_times_b(trained):
    reference = sgd_reference(TASK1A)
    for got, want in zip(trained[0]["sgd-model"], reference, strict=True):
        assert_close(got, want)


def test_centralized_adam_by_model_and_by_layer_agree_and_equal_one_process_adam(trained):
    for a, b in zip(trained[0]["adam-model"], trained[0]["adam-layer"]):
        assert all(torch.equal(ta, tb) for ta, tb in zip(a, b))
    reference = one_process(lambda ps: torch.optim.Adam(ps, lr=0.0, weight_decay=TASK1A.weight_decay),
                            lr_scale=0.08)
    for got, want in zip(trained[0]["adam-model"], reference, strict=True):
        assert_close(got, want)
    assert not all(torch.equal(a, b) for a, b in zip(trained[0]["adam-model"][-1], trained[0]["sgd-model"][-1]))


def test_centralized_adamw_equals_one_process_adamw_with_the_tasks_betas_and_decay_on_the_matrices(trained):
    def matrices_only(params):
        params = list(params)
        return torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                                 lr=0.0, betas=(0.9, 0.95), eps=1e-8)

    for got, want in zip(trained[0]["adamw-model"], one_process(matrices_only), strict=True):
        assert_close(got, want)
    everything = one_process(lambda ps: torch.optim.AdamW(ps, lr=0.0, betas=(0.9, 0.95), weight_decay=0.1))
    for got, want in zip(trained[0]["adamw-all"], everything, strict=True):
        assert_close(got, want)
    biases = [i for i, p in enumerate(trained[0]["adamw-model"][-1]) if p.dim() < 2]
    assert biases and not all(torch.equal(trained[0]["adamw-model"][-1][i], trained[0]["adamw-all"][-1][i])
                              for i in biases)


def test_model_averaging_of_plain_sgd_equals_centralized_sgd_after_every_step(trained):
    for key in ("plain-averaging", "plain-averaging-by-layer"):
        for got, want in zip(trained[0][key], trained[0]["plain-sgd"], strict=True):
            assert_close(got, want)
    for got, want in zip(trained[0]["plain-sgd"], sgd_reference(PLAIN), strict=True):
        assert_close(got, want)


def test_ddp_equals_centralized_sgd(trained):
    for got, want in zip(trained[0]["ddp"], trained[0]["sgd-model"], strict=True):
        assert_close(got, want)

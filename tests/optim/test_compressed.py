"""signSGD and sparsified SGD on real gloo processes: the vote, and error feedback's invariant."""

from __future__ import annotations

import pytest
import torch

from mlbench.optim.base import OptimizerContext, flat_params
from mlbench.optim.catalog import build_optimizer
from mlbench.optim.compression import pack_signs, unpack_signs
from mlbench.timing import PhaseTimer
from mlbench.worker.hyper import task_hyper
from tests.optim.support import PLAIN, loss_on, tiny_data, tiny_model

LR = 0.5
STEPS = 4


def rank_gradients(rank: int, step: int, numel: int) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(100 * step + rank))


def set_flat_grads(params: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
        offset += p.numel()


def sign_step(rank: int, world: int) -> dict:
    model = tiny_model()
    ctx = OptimizerContext(model=model, hyper=task_hyper(PLAIN, world), world_size=world, rank=rank,
                           timer=PhaseTimer(torch.device("cpu")), options={"lr_scale": "0.1"})
    opt = build_optimizer("signsgd", ctx)
    before = flat_params(opt.params)
    grads = rank_gradients(rank, 0, before.numel())
    set_flat_grads(opt.params, grads)
    opt.step(LR)
    return {"before": before, "after": flat_params(opt.params), "grads": grads, "bytes": opt.bytes_sent}


def test_signsgd_update_is_the_sign_of_the_sum_of_signs(on_ranks):
    world = 3
    results = on_ranks(sign_step, world)
    votes = sum(torch.where(res["grads"] >= 0, 1.0, -1.0) for res in results)
    expected = results[0]["before"] - LR * 0.1 * torch.sign(votes)
    for res in results:
        assert torch.equal(res["after"], expected)
    numel = results[0]["before"].numel()
    assert results[0]["bytes"] == (world - 1) * ((numel + 7) // 8)     # one bit per coordinate


def test_sign_bits_round_trip():
    x = torch.tensor([0.5, -1.0, 0.0, -0.0, 3.0, -2.0, 1.0, -1.0, 7.0, -7.0, 1e-9])
    assert pack_signs(x).numel() == 2
    assert torch.equal(unpack_signs(pack_signs(x), x.numel()), torch.where(x >= 0, 1.0, -1.0))


def error_feedback_run(rank: int, world: int, name: str, options: dict) -> dict:
    """STEPS steps on given gradients; what each rank put in (lr * g) and what it kept."""
    model = tiny_model()
    ctx = OptimizerContext(model=model, hyper=task_hyper(PLAIN, world), world_size=world, rank=rank,
                           timer=PhaseTimer(torch.device("cpu")), options=options)
    opt = build_optimizer(name, ctx)
    start = flat_params(opt.params)
    accumulated = torch.zeros_like(start)
    for step in range(STEPS):
        grads = rank_gradients(rank, step, start.numel())
        set_flat_grads(opt.params, grads)
        accumulated += LR * grads
        opt.step(LR)
    return {"start": start, "end": flat_params(opt.params), "accumulated": accumulated,
            "memory": opt.memory, "bytes": opt.bytes_sent, "k": getattr(opt, "k", None)}


@pytest.mark.parametrize("name,options", [
    ("sparsified-sgd", {"method": "topk", "ratio": "0.05"}),
    ("sparsified-sgd", {"method": "randomk", "ratio": "0.05"}),
    ("signsgd", {"error_feedback": "true"}),
])
def test_error_feedback_memory_plus_sent_equals_the_accumulated_update(on_ranks, name, options):
    """x_0 - x_T = mean over ranks of (sum of lr * g - memory): every rank sent all it did not keep."""
    world = 2
    results = on_ranks(error_feedback_run, world, name, options)
    assert torch.equal(results[0]["end"], results[1]["end"])
    sent = torch.stack([res["accumulated"] - res["memory"] for res in results]).mean(0)
    torch.testing.assert_close(results[0]["start"] - results[0]["end"], sent, atol=1e-5, rtol=1e-5)
    for res in results:
        assert res["memory"].abs().sum() > 0.1 * res["accumulated"].abs().sum()
    if name == "sparsified-sgd":
        k = results[0]["k"]
        assert k == int(0.05 * results[0]["start"].numel())
        assert results[0]["bytes"] == STEPS * (world - 1) * k * 8


def test_topk_keeps_the_largest_coordinates(on_ranks):
    results = on_ranks(error_feedback_run, 1, "sparsified-sgd", {"ratio": "0.05"})
    res = results[0]
    moved = (res["start"] - res["end"]) != 0
    assert int(moved.sum()) <= STEPS * res["k"]
    assert res["bytes"] == 0


def test_sign_and_sparse_steps_train_a_tiny_model(on_ranks):
    losses = on_ranks(train_tiny_losses, 2)
    for name, (first, last) in losses[0].items():
        assert last < first, name


def train_tiny_losses(rank: int, world: int) -> dict:
    x, y = tiny_data(64)
    out = {}
    for name, options in (("signsgd", {}), ("signsgd", {"error_feedback": "true"}),
                          ("sparsified-sgd", {"ratio": "0.1"})):
        model = tiny_model()
        ctx = OptimizerContext(model=model, hyper=task_hyper(PLAIN, world), world_size=world, rank=rank,
                               timer=PhaseTimer(torch.device("cpu")), options=options)
        opt = build_optimizer(name, ctx)
        first = float(loss_on(model, x, y))
        for _ in range(30):
            opt.zero_grad()
            loss_on(model, x[rank::world], y[rank::world]).backward()
            opt.step(0.5)
        out[f"{name} {options}"] = (first, float(loss_on(model, x, y)))
    return out

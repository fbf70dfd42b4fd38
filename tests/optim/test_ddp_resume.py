"""`--optimizer ddp --opt hook=powersgd` resumes exactly: the state of torch's PowerSGD hook (error
feedback, P and Q memories, its step counter and its numpy generator) goes through the
optimizer's state_dict, and a resumed DDP (whose first step groups every gradient in one bucket,
unlike the buckets the state was built in) continues with the very parameters of an uninterrupted
run. Two real gloo ranks, the tiny conv+linear model (DDP's default buckets: one, whose order of
parameters changes at the rebuild, which is enough to break a naive restore; several buckets with
torch's hook on gloo can deadlock, a torch matter): N steps + a checkpoint (through torch.save and
torch.load(weights_only=True), as a checkpoint file) + M steps against N+M steps.
"""

from __future__ import annotations

import io

import torch

from mlbench.optim.base import OptimizerContext
from mlbench.optim.catalog import build_optimizer
from mlbench.timing import PhaseTimer
from mlbench.worker.hyper import task_hyper
from tests.optim.support import PLAIN, loss_on, params_of, tiny_data, tiny_model

N, M, BATCH = 4, 3, 8
OPTIONS = {"hook": "powersgd", "rank": "1", "start_iter": "2"}


def _ddp(rank: int, world: int, model: torch.nn.Module):
    ctx = OptimizerContext(model=model, hyper=task_hyper(PLAIN, world), world_size=world, rank=rank,
                           timer=PhaseTimer(torch.device("cpu")), options=OPTIONS)
    return build_optimizer("ddp", ctx)


def _steps(opt, rank: int, first: int, last: int) -> None:
    x, y = tiny_data(64, seed=5)
    for step in range(first, last):
        start = (step * 2 + rank) * BATCH % 64
        opt.zero_grad()
        loss_on(opt.module, x[start:start + BATCH], y[start:start + BATCH]).backward()
        opt.step(0.1)


def _resumed_and_uninterrupted(rank: int, world: int):
    reference = _ddp(rank, world, tiny_model())
    _steps(reference, rank, 0, N + M)

    first = _ddp(rank, world, tiny_model())
    _steps(first, rank, 0, N)
    buffer = io.BytesIO()
    torch.save({"model": first.module.module.state_dict(), "optimizer": first.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    model = tiny_model(seed=7)  # other weights: all of them must come from the checkpoint
    model.load_state_dict(saved["model"])
    resumed = _ddp(rank, world, model)
    resumed.load_state_dict(saved["optimizer"])
    _steps(resumed, rank, N, N + M)
    return params_of(reference.module.module), params_of(model), reference.bytes_sent, resumed.bytes_sent


def test_ddp_powersgd_hook_resumes_exactly(on_ranks):
    for expected, actual, _, _ in on_ranks(_resumed_and_uninterrupted, 2):
        assert len(expected) == len(actual) == 4
        for e, a in zip(expected, actual):
            assert torch.equal(e, a)

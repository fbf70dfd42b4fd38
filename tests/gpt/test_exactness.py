"""Task 5a: k workers accumulating their micro-batches equal one process with the global batch.

Real worker processes in a gloo group (127.0.0.1) run task 5a's runtime with its optimizer,
centralized-adamw (all-reduce, the clipping of the averaged gradient, AdamW with decay on the
matrices), for a few steps of llm.c's schedule on shards this test writes. A step is 8 sequences
whatever the worker count: 1 worker accumulates 4 micro-batches of 2, 2 workers 2 each, 4
workers 1 each; the reference is one process with one micro-batch of all 8. The parameters and
the all-reduced validation loss afterwards must agree. The same holds for ``fsdp``, which shards
the weights, gradients and AdamW's state over the workers (FSDP2's fully_shard, ZeRO-3), against
the same one-process reference. With 10 validation sequences, 4 workers hold 3, 3, 2 and 2 of
them: the evaluation's forward passes (collectives for a sharded model) must still pair up.

In float64: Adam divides each coordinate by the root of its own squared gradients, so a
coordinate whose gradient is zero in exact arithmetic (the attention's key bias: softmax ignores
a constant added to every score) moves by the rate on fp32 rounding noise alone, and another
summation order (an all-reduce, an accumulation) moves it differently. In float64 that noise is
about 1e-16 and the runs agree to 1e-10, so a lost micro-batch, a wrong mean, a clip before the
all-reduce or a rank reading another's sequences shows.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from mlbench.optim.base import OptimizerContext
from mlbench.optim.catalog import build_optimizer
from mlbench.tasks.task5a import TASK5A
from mlbench.tasks.task5a.runtime import GPTRuntime
from mlbench.tasks.task5a.settings import GPTSettings
from mlbench.tasks.task5a.shards import write_shard
from mlbench.timing import PhaseTimer
from mlbench.worker.hyper import task_hyper

CPU = torch.device("cpu")
TINY = dataclasses.replace(GPTSettings(), layers=2, width=32, head_dim=16, context=16, vocab_size=100,
                           padded_vocab=128, global_batch=8, batch_per_worker=2, steps=4, warmup_steps=1,
                           eval_every=4, eval_tokens=16 * 10, lr=3e-3, grad_clip=0.5)
STEPS = 4


@pytest.fixture
def shards(tmp_path):
    rng = np.random.default_rng(7)
    pattern = rng.integers(0, TINY.vocab_size, 37)
    tokens = np.where(rng.random(8000) < 0.2, rng.integers(0, TINY.vocab_size, 8000), np.tile(pattern, 217)[:8000])
    write_shard(tmp_path / "fineweb_val_000000.bin", tokens[:1000])
    write_shard(tmp_path / "fineweb_train_000001.bin", tokens[1000:4000])
    write_shard(tmp_path / "fineweb_train_000002.bin", tokens[4000:])  # steps cross into the second shard
    return str(tmp_path)


def train(rank: int, world: int, data_dir: str, batch_per_worker: int, name: str = "centralized-adamw",
          wide: bool = True):
    settings = dataclasses.replace(TINY, batch_per_worker=batch_per_worker)
    runtime = GPTRuntime(settings, data_dir=data_dir, rank=rank, world=world)
    if wide:
        runtime.model.double()
    spec = dataclasses.replace(TASK5A, settings=settings)
    opt = build_optimizer(name, OptimizerContext(model=runtime.model, hyper=task_hyper(spec, world),
                                                 world_size=world, rank=rank,
                                                 timer=PhaseTimer(CPU, enabled=False)))
    micro, rates = [], []
    for batch in runtime.batches(0):
        micro.append(len(batch.micro))
        rates.append(runtime.lr(batch.step, batch))
        runtime.train_step(batch, rates[-1], opt)
    whole = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in runtime.model.parameters()]
    return [p.detach().clone() for p in whole], runtime.evaluate()["val_loss"], micro, rates


@pytest.mark.parametrize("name", ["centralized-adamw", "fsdp"])
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_k_workers_accumulating_equal_one_process_with_the_global_batch(on_ranks, shards, workers, name):
    reference, ref_loss, ref_micro, rates = train(0, 1, shards, batch_per_worker=8)
    assert ref_micro == [1] * STEPS and rates[0] == pytest.approx(TINY.lr) and rates[-1] < rates[1]
    initial = GPTRuntime(TINY, data_dir=shards).model
    assert max(float((p.detach().double() - q).abs().max()) for p, q in zip(initial.parameters(), reference)) > 1e-3
    for params, loss, micro, got_rates in on_ranks(train, workers, shards, 2, name, timeout=240):
        assert micro == [4 // workers] * STEPS and got_rates == rates
        for p, q in zip(params, reference, strict=True):
            torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-10)
        assert abs(loss - ref_loss) < 1e-10


#: The catalogue's methods that run task 5a: those that hold the averaged gradient clip it; those
#: of local updates (model averaging, the DiLoCo family) clip each rank's own.
RUN_ON_5A = ("ddp", "powersgd", "model-averaging", "diloco", "streaming-diloco", "sparseloco")


def test_the_catalogues_methods_train_task_5a_on_two_workers(on_ranks, shards):
    initial = [p.detach().clone() for p in GPTRuntime(TINY, data_dir=shards).model.parameters()]
    for name in RUN_ON_5A:
        ranks = on_ranks(train, 2, shards, 2, name, False, timeout=240)
        for params, loss, micro, _ in ranks:
            assert micro == [2] * STEPS and math.isfinite(loss), name
            assert all(torch.isfinite(p).all() for p in params), name
            assert max(float((p - q).abs().max()) for p, q in zip(params, initial)) > 1e-4, name  # it trained
        assert ranks[0][1] == ranks[1][1], name   # the all-reduced loss of one (evaluated) model

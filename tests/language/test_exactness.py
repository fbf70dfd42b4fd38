"""k workers equal one process with the k-fold batch, for tasks 3a and 4b (dropout off).

Two real worker processes in a gloo group (127.0.0.1) run each task's runtime with the
reference optimizer for a few steps on small real-format data; one process runs the same
runtime with one worker and the 2-fold batch. The parameters afterwards and the all-reduced
evaluation must agree to float32 rounding: the same columns (3a) or the same global batches
(4b), the loss normalised over all workers, the gradient clipped after averaging, the same
random BPTT lengths on every rank without a collective.

Both tasks compare after plain SGD steps: Adam (4b's optimizer) divides each coordinate by the
root of its own squared gradients, so a coordinate whose gradient is zero in exact arithmetic,
such as the bias of the attention's key projection (softmax ignores a constant added to every
score), moves by +-lr on float rounding noise alone and cannot agree to 1e-5 between any two
summation orders, distributed or not.
"""

from __future__ import annotations

import dataclasses
import os

import torch
from torch import nn

from mlbench.optim.base import OptimizerContext
from mlbench.optim.catalog import build_optimizer
from mlbench.tasks.precision import DynamicLossScaler
from mlbench.tasks.task1a import TASK1A
from mlbench.tasks.task3a.runtime import LanguageModelRuntime
from mlbench.tasks.task3a.settings import LanguageModelSettings
from mlbench.tasks.task4b.runtime import TranslationRuntime
from mlbench.tasks.task4b.settings import TranslationSettings
from mlbench.timing import PhaseTimer
from mlbench.worker.hyper import task_hyper

CPU = torch.device("cpu")
SGD_3A = TASK1A.with_settings(momentum=0.0, nesterov=False, weight_decay=1.2e-6)
LM = LanguageModelSettings(batch_per_worker=2, eval_batch=2, bptt=10, embedding=8, hidden=12, layers=3,
                           dropout=0, dropout_h=0, dropout_i=0, dropout_e=0, weight_drop=0, grad_clip=0.05)
MT = TranslationSettings(vocab_size=120, batch_per_worker=64, global_tokens=256, max_len=40, dim=16, ffn=32, heads=2,
                         encoder_layers=1, decoder_layers=1, dropout=0, attention_dropout=0,
                         activation_dropout=0, eval_sentences=10, eval_batch=4)
STEPS = 5


def optimizer(name: str, model: nn.Module, spec, rank: int, world: int):
    return build_optimizer(name, OptimizerContext(model=model, hyper=task_hyper(spec, world),
                                                  world_size=world, rank=rank,
                                                  timer=PhaseTimer(CPU, enabled=False)))


def train_lm(rank: int, world: int, data_root: str, data_dir: str, batch: int,
             name: str = "centralized-sgd") -> tuple[list, dict]:
    os.environ["MLBENCH_DATA"] = data_root
    runtime = LanguageModelRuntime(dataclasses.replace(LM, batch_per_worker=batch), data_dir=data_dir,
                                   rank=rank, world=world)
    opt = optimizer(name, runtime.model, SGD_3A, rank, world)
    lengths = []
    for _, b in zip(range(STEPS), runtime.batches(0)):
        lengths.append(b.data.size(0))
        runtime.train_step(b, 20.0 * b.data.size(0) / LM.bptt, opt)  # the same rate in both runs
    return [p.detach().clone() for p in runtime.model.parameters()], {**runtime.evaluate(), "lengths": lengths}


def train_mt(rank: int, world: int, data_root: str, data_dir: str,
             name: str = "centralized-sgd") -> tuple[list, dict]:
    os.environ["MLBENCH_DATA"] = data_root
    runtime = TranslationRuntime(MT, data_dir=data_dir, rank=rank, world=world)
    opt = optimizer(name, runtime.model, SGD_3A, rank, world)
    micro = []
    for _, b in zip(range(STEPS), runtime.batches(0)):
        micro.append(len(b.micro))
        runtime.train_step(b, 0.5, opt)
    return [p.detach().clone() for p in runtime.model.parameters()], {**runtime.evaluate(), "micro": micro}


def both_optimizers(rank: int, world: int, train, *args) -> dict[str, tuple[list, dict]]:
    """The reference all-reduce and DDP (which clips and accumulates through its own path)."""
    return {name: train(rank, world, *args, name=name) for name in ("centralized-sgd", "ddp")}


def assert_same_parameters(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)


def test_3a_two_workers_equal_one_process_with_twice_the_columns(on_ranks, wikitext_dir):
    root = os.environ["MLBENCH_DATA"]
    single, single_eval = train_lm(0, 1, root, str(wikitext_dir), batch=4)
    ranks = [run for by_name in on_ranks(both_optimizers, 2, train_lm, root, str(wikitext_dir), 2)
             for run in by_name.values()]
    for params, evaluation in ranks:
        assert_same_parameters(params, single)
        assert evaluation["lengths"] == single_eval["lengths"]
        assert evaluation["loss"] == single_eval["loss"] or abs(evaluation["loss"] - single_eval["loss"]) < 1e-6
    initial = LanguageModelRuntime(dataclasses.replace(LM, batch_per_worker=4), data_dir=str(wikitext_dir))
    assert any(not torch.allclose(p, q) for p, q in zip(initial.model.parameters(), single))  # it trained


def test_4b_two_workers_equal_one_process_accumulating_their_micro_batches(on_ranks, parallel_dir):
    root = os.environ["MLBENCH_DATA"]
    single, single_eval = train_mt(0, 1, root, str(parallel_dir))
    ranks = [run for by_name in on_ranks(both_optimizers, 2, train_mt, root, str(parallel_dir))
             for run in by_name.values()]
    assert single_eval["micro"] == [4] * STEPS
    for params, evaluation in ranks:
        assert evaluation["micro"] == [2] * STEPS
        assert_same_parameters(params, single)
        assert abs(evaluation["loss"] - single_eval["loss"]) < 1e-5
        assert abs(evaluation["bleu"] - single_eval["bleu"]) < 1e-9


def scaled_steps(rank: int, world: int) -> list[tuple[bool, float, list[float]]]:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = optimizer("centralized-sgd", model, SGD_3A, rank, world)
    scaler = DynamicLossScaler(list(model.parameters()), CPU)
    opt.set_grad_hook(scaler.unscale_and_check, "unscale")
    out = []
    for step in range(2):
        before = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad()
        overflow = step == 0 and rank == 1  # one rank's gradient overflows on the first step
        x = torch.full((1, 3), float("inf") if overflow else 1.0)
        scaler.scale(model(x).sum()).backward()
        opt.step(0.1)
        moved = any(not torch.equal(p, b) for p, b in zip(model.parameters(), before))
        out.append((moved, scaler.get_scale(), torch.cat([p.detach().view(-1) for p in model.parameters()]).tolist()))
    return out


def test_fp16_loss_scaling_skips_an_overflow_on_every_rank_and_halves_the_scale(on_ranks):
    ranks = on_ranks(scaled_steps, 2)
    assert ranks[0] == ranks[1]                                  # the ranks stay identical
    (moved0, scale0, _), (moved1, scale1, _) = ranks[0]
    assert (moved0, scale0) == (False, 2.0 ** 15)                # skipped, 65536 / 2
    assert (moved1, scale1) == (True, 2.0 ** 15)                 # unscaled and applied

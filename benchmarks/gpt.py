"""Task 5a training throughput: mlbench's GPT-2 step vs a plain nanoGPT-style loop, in one run.

    python benchmarks/gpt.py                                   # CPU, a small GPT (4 x 256, context 256)
    python benchmarks/gpt.py --steps 3 --repeats 5 --set layers=2
    python benchmarks/gpt.py --device cuda                     # GPT-2 small, bf16 autocast, MFU vs 989 TFLOP/s

One worker (world size 1, a one-process gloo group), synthetic tokens. mlbench's side is the code a
worker runs: ``GPTRuntime.batches`` draws the step's micro-batches and ``GPTRuntime.train_step``
trains on them with the task's optimizer, ``centralized-adamw``, built by ``build_optimizer``. The
plain side is the loop nanoGPT and llm.c write: the same ``GPT`` class from the same seed, the same
tokens read as llm.c's loader reads them (a contiguous slice, viewed as inputs and targets),
``torch.optim.AdamW`` with the same betas, eps and decay groups (decay on the matrices),
gradient accumulation over the same micro-batches, ``clip_grad_norm_(1.0)`` and cross-entropy;
bf16 autocast around the forward pass on a GPU, fp32 on the CPU, as task 5a computes. Both take
the learning rate of task 5a's schedule at each step. The cases are timed in interleaved rounds
(benchmarks/measure.py) after an untimed warm-up; tokens/s is the median (slowest-fastest round),
GFLOP/s is tokens/s x ``flops_per_token`` (6N + 12LHQT), and on a GPU MFU is that over
``--peak-tflops``. The two sides' losses at every step are compared: they train the same model on
the same tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from measure import DEFAULT_REPEATS, interleave, machine_line, ratio_spread, spread

from mlbench.optim.base import OptimizerContext
from mlbench.optim.catalog import build_optimizer
from mlbench.results.environment import cpu_model, usable_cores
from mlbench.tasks.overrides import resolve
from mlbench.tasks.spec import TaskSpec
from mlbench.tasks.task5a import TASK5A
from mlbench.tasks.task5a.model import GPT, flops_per_token, parameter_count
from mlbench.tasks.task5a.runtime import GPTRuntime
from mlbench.tasks.task5a.settings import GPTSettings
from mlbench.timing import PhaseTimer
from mlbench.worker.hyper import task_hyper

#: Model sizes: a GPT that trains in seconds per step on a few cores, and task 5a's GPT-2 small
#: with a step of 64 sequences (the closed division's is 512) for a GPU.
SIZES: dict[str, dict[str, int]] = {
    "small": {"layers": 4, "width": 256, "head_dim": 64, "context": 256, "batch_per_worker": 8, "global_batch": 16},
    "gpt2": {"layers": 12, "width": 768, "head_dim": 64, "context": 1024, "batch_per_worker": 16, "global_batch": 64},
}

#: A step function: trains on the next step's tokens, returns that step's mean loss (not synchronised).
Step = Callable[[], torch.Tensor]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def task_spec(size: str, overrides: list[str], steps_needed: int) -> TaskSpec:
    """Task 5a with the size's settings and ``--set`` values (checked as `mlbench run --set` checks
    them), and synthetic tokens enough for ``steps_needed`` steps."""
    values: dict[str, object] = dict(SIZES[size])
    for item in overrides:
        key, _, value = item.partition("=")
        values[key] = value
    spec, _ = resolve(TASK5A, values)
    assert isinstance(spec, TaskSpec)
    settings = spec.settings
    assert isinstance(settings, GPTSettings)
    tokens = steps_needed * settings.tokens_per_step + 1
    return dataclasses.replace(spec, settings=dataclasses.replace(settings, synthetic_tokens=(tokens,
                                                                                              settings.context + 1)))


def mlbench_step(spec: TaskSpec, device: torch.device, seed: int) -> tuple[Step, GPTRuntime, PhaseTimer]:
    """mlbench's step as a worker runs it: the runtime's next batch, then ``train_step`` with the
    task's optimizer (phase timing on, the worker's default)."""
    settings = spec.settings
    assert isinstance(settings, GPTSettings)
    timer = PhaseTimer(device)
    runtime = GPTRuntime(settings, synthetic=True, device=device, seed=seed, timer=timer)
    optimizer = build_optimizer(spec.optimizer, OptimizerContext(model=runtime.model, hyper=task_hyper(spec, 1),
                                                                 world_size=1, rank=0, timer=timer))
    batches = itertools.chain.from_iterable(runtime.batches(epoch) for epoch in itertools.count())

    def step() -> torch.Tensor:
        batch = next(batches)
        return runtime.train_step(batch, runtime.lr(0, batch), optimizer)
    return step, runtime, timer


def plain_step(settings: GPTSettings, device: torch.device, seed: int) -> Step:
    """The nanoGPT / llm.c loop on the same model, tokens and schedule."""
    tokens = torch.from_numpy(np.random.default_rng(seed).integers(0, settings.vocab_size,
                                                                   settings.synthetic_tokens[0], dtype=np.int64))
    torch.manual_seed(seed)
    model = GPT(layers=settings.layers, heads=settings.heads, width=settings.width, context=settings.context,
                vocab=settings.padded_vocab).to(device)
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": settings.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=settings.lr, betas=(settings.adam_beta1, settings.adam_beta2),
                            eps=settings.adam_eps)
    accumulation, batch, context = settings.accumulation(1), settings.batch_per_worker, settings.context
    bf16 = device.type == "cuda"
    counter: Iterator[int] = itertools.count()

    def step() -> torch.Tensor:
        i = next(counter)
        for group in opt.param_groups:
            group["lr"] = settings.learning_rate(i)
        opt.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=device)
        for m in range(accumulation):
            start = i * settings.tokens_per_step + m * batch * context
            buf = tokens[start:start + batch * context + 1]
            x = buf[:-1].view(batch, context).to(device, non_blocking=True)
            y = buf[1:].view(batch, context).to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(x)
                loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
            (loss / accumulation).backward()
            loss_sum += loss.detach()
        torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)
        opt.step()
        return loss_sum / accumulation
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--size", choices=sorted(SIZES), default=None,
                        help="the model and its step (SIZES; default: small on the CPU, gpt2 on a GPU)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a task-5a setting over the size's (layers, width, context, global_batch, ...)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per round (cpu 3, cuda 20)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps per case first (cpu 1, cuda 5)")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    parser.add_argument("--threads", type=int, default=None, help="torch threads on the CPU (default: every core)")
    parser.add_argument("--peak-tflops", type=float, default=989.0,
                        help="the GPU's peak for MFU (989: H100 SXM bf16 dense)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no GPU here")
    cuda = args.device == "cuda"
    steps = args.steps or (20 if cuda else 3)
    warmup = args.warmup if args.warmup is not None else (5 if cuda else 1)
    device = torch.device(args.device)
    if not cuda:
        torch.set_num_threads(args.threads or usable_cores())
    spec = task_spec(args.size or ("gpt2" if cuda else "small"), args.overrides, warmup + steps * args.repeats + 1)
    settings = spec.settings
    assert isinstance(settings, GPTSettings)

    where = torch.cuda.get_device_name() if cuda else f"{cpu_model()}, {torch.get_num_threads()} threads"
    print(machine_line(f"{where} | torch {torch.__version__} | {args.repeats} interleaved rounds of {steps} "
                       f"steps after {warmup} warm-up; median (range)"), flush=True)
    with tempfile.TemporaryDirectory() as folder:   # the one-process group a worker of world size 1 joins
        dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1)
        try:
            table, losses, model = measure(spec, device, args.seed, steps, warmup, args.repeats, args.peak_tflops)
        finally:
            dist.destroy_process_group()

    print(f"# load average at the end {os.getloadavg()[0]:.1f}")
    print(f"# GPT {settings.layers} x {settings.width} ({settings.heads} heads), context {settings.context}, "
          f"{parameter_count(model) / 1e6:.1f} M parameters, {flops_per_token(model, settings.context) / 1e6:.1f} "
          f"MFLOP/token; {settings.tokens_per_step:,} tokens/step in {settings.accumulation(1)} micro-batches of "
          f"{settings.batch_per_worker}; {'bf16 autocast' if cuda else 'fp32'}")
    gap = max(abs(a - b) for a, b in zip(losses["plain"], losses["mlbench"], strict=True))
    print(f"# the same training: losses of steps 1-{len(losses['plain'])} plain {losses['plain'][0]:.4f} ... "
          f"{losses['plain'][-1]:.4f}, mlbench {losses['mlbench'][0]:.4f} ... {losses['mlbench'][-1]:.4f}, "
          f"at most {gap:.1e} apart")
    headers = ["task 5a step, 1 worker", "s/step", "tokens/s", "GFLOP/s", "vs plain"] + (["MFU"] if cuda else [])
    print(tabulate(table, headers=headers, tablefmt="github"))


def measure(spec: TaskSpec, device: torch.device, seed: int, steps: int, warmup: int, repeats: int,
            peak_tflops: float) -> tuple[list[list[str]], dict[str, list[float]], GPT]:
    """The table's rows, each side's loss at every step (warm-up included), and mlbench's model."""
    settings = spec.settings
    assert isinstance(settings, GPTSettings)
    ours, runtime, timer = mlbench_step(spec, device, seed)
    cases = {"plain": plain_step(settings, device, seed), "mlbench": ours}
    losses: dict[str, list[torch.Tensor]] = {name: [] for name in cases}
    for name, step in cases.items():
        losses[name].extend(step() for _ in range(warmup))

    def timed(name: str) -> float:
        sync(device)
        begin = time.perf_counter()
        for _ in range(steps):
            losses[name].append(cases[name]())
        sync(device)
        seconds = (time.perf_counter() - begin) / steps
        timer.collect()   # once per round, as a worker collects once per logging interval
        return seconds

    rounds: dict[str, Callable[[], float]] = {name: functools.partial(timed, name) for name in cases}
    seconds = interleave(rounds, repeats)
    per_token = flops_per_token(runtime.model, settings.context)
    tokens = settings.tokens_per_step
    rows = []
    labels = {"plain": "plain PyTorch (nanoGPT-style, torch.optim.AdamW)",
              "mlbench": f"mlbench GPTRuntime.train_step + {spec.optimizer}"}
    for name, values in seconds.items():
        rates = [tokens / s for s in values]
        row = [labels[name], spread(values, "{:.3f}"), spread(rates),
               spread([r * per_token / 1e9 for r in rates], "{:,.1f}"),
               ratio_spread(seconds["plain"], values)]
        if device.type == "cuda":
            row.append(f"{100 * statistics.median(rates) * per_token / (peak_tflops * 1e12):.1f}% of {peak_tflops:g}")
        rows.append(row)
    return rows, {name: [float(v) for v in values] for name, values in losses.items()}, runtime.model


if __name__ == "__main__":
    main()

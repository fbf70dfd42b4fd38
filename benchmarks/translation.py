"""Task 4b's training step: mlbench's runtime and reference optimizer vs a plain PyTorch DDP loop.

    python benchmarks/translation.py                          # GPU if visible (full size), else CPU
    python benchmarks/translation.py --device cpu --size small --workers 2 --steps 4 --repeats 5
    python benchmarks/translation.py --device cuda --size big --workers 1

Both sides run K processes (gloo on the CPU, NCCL on GPUs) over the same synthetic task-4b
batches (random sentence pairs of 4..79 tokens, token-bucketed into micro-batches of at most
``--max-tokens``, accumulated to ``--global-tokens`` per step) and the same model:

* **mlbench**: ``TranslationRuntime.train_step`` with ``centralized-adam`` (Adam 0.9/0.98/1e-9):
  micro-batch forwards and backwards, then one flat all-reduce of the gradients and the update;
  the precision the runtime picks (bf16 autocast on a GPU that has it, fp32 on the CPU);
* **plain**: what a user writes from the PyTorch DDP tutorial: ``DistributedDataParallel``
  (bucketed all-reduce overlapped with the last backward; ``no_sync`` for the others),
  ``torch.optim.Adam`` with the same betas and eps, the same loss (label-smoothed cross entropy
  summed over tokens, divided by the global token count) under the same autocast.

Figures: seconds per step of rank 0 (median over the timed steps, after ``--warmup`` steps) and
target tokens per second over all workers. Both sides run once per round, ``--repeats`` rounds
(benchmarks/measure.py); each figure is the median of the rounds (fastest-slowest), and "vs
plain" is the plain loop's s/step over mlbench's, round by round (above 1.00x: mlbench faster).
The first line names the date, machine and torch.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import DEFAULT_REPEATS, interleave, machine_line, ratio_spread, spread

from mlbench.optim.base import OptimizerContext
from mlbench.optim.catalog import build_optimizer
from mlbench.tasks.precision import autocast
from mlbench.tasks.task4b import TASK4B
from mlbench.tasks.task4b.bpe import PAD
from mlbench.tasks.task4b.runtime import TranslationRuntime
from mlbench.tasks.task4b.settings import TranslationSettings
from mlbench.timing import PhaseTimer
from mlbench.worker.hyper import task_hyper

SIZES = {  # dim, ffn, heads, layers per stack
    "big": (1024, 4096, 16, 6),      # task 4b's model (about 210 M parameters with 32k words)
    "base": (512, 2048, 8, 6),       # Vaswani et al.'s base model
    "small": (256, 1024, 4, 3),
}
SPEC = TASK4B  # Adam's values (0.9, 0.98, 1e-9) and no weight decay, as the task


def settings(args: argparse.Namespace) -> TranslationSettings:
    dim, ffn, heads, layers = SIZES[args.size]
    return TranslationSettings(dim=dim, ffn=ffn, heads=heads, encoder_layers=layers, decoder_layers=layers,
                               batch_per_worker=args.max_tokens, global_tokens=args.global_tokens,
                               synthetic_pairs=(args.pairs, 8))


def plain_step(runtime: TranslationRuntime, world: int, device: torch.device):
    """The DDP tutorial loop over the runtime's batches: returns step(batch, lr)."""
    model = torch.nn.parallel.DistributedDataParallel(
        runtime.model, device_ids=[device.index] if device.type == "cuda" else None)
    adam = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(SPEC.adam_beta1, SPEC.adam_beta2),
                            eps=SPEC.adam_eps)

    def step(batch, lr: float) -> None:
        for group in adam.param_groups:
            group["lr"] = lr
        adam.zero_grad()
        for j, mb in enumerate(batch.micro):
            sync = contextlib.nullcontext() if j == len(batch.micro) - 1 else model.no_sync()
            with sync:
                with autocast(device, runtime.precision):
                    logits = model(mb.src, mb.tgt_in)
                    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), mb.tgt_out.reshape(-1),
                                           ignore_index=PAD, label_smoothing=0.1, reduction="sum")
                (loss * world / batch.total_tokens).backward()
        adam.step()
    return step


def worker(rank: int, world: int, mode: str, args: argparse.Namespace, port: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    runtime = TranslationRuntime(settings(args), synthetic=True, rank=rank, world=world, device=device)
    if mode == "mlbench":
        opt = build_optimizer("centralized-adam", OptimizerContext(
            model=runtime.model, hyper=task_hyper(SPEC, world), world_size=world, rank=rank,
            timer=PhaseTimer(device, enabled=False)))
        step = lambda batch, lr: runtime.train_step(batch, lr, opt)
    else:
        step = plain_step(runtime, world, device)
    times, tokens = [], []
    for i, batch in enumerate(runtime.batches(0)):
        if i == args.warmup + args.steps:
            break
        if cuda:
            torch.cuda.synchronize()
        begin = time.perf_counter()
        step(batch, runtime.lr(1000 + i))
        if cuda:
            torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - begin)
            tokens.append(batch.total_tokens)
    if rank == 0:
        params = sum(p.numel() for p in runtime.model.parameters())
        out.put((statistics.median(times), sum(tokens) / sum(times), params, runtime.precision))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(mode: str, args: argparse.Namespace) -> tuple[float, float, int, str]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, args.workers, mode, args, port, out)) for r in range(args.workers)]
    for p in procs:
        p.start()
    while True:   # a worker that dies before rank 0 reports would leave out.get() waiting for ever
        try:
            result = out.get(timeout=5)
            break
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.kill()
                    p.join()
                raise SystemExit(f"a {mode} worker failed") from None
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise SystemExit(f"a {mode} worker failed")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", choices=list(SIZES), default=None, help="big on a GPU, small on the CPU")
    parser.add_argument("--workers", type=int, default=None, help="default: the GPUs, or 2 on the CPU")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=None, help="per micro-batch (2^13 on a GPU)")
    parser.add_argument("--global-tokens", type=int, default=None, help="per step (2^17 on a GPU)")
    parser.add_argument("--pairs", type=int, default=20_000, help="synthetic sentence pairs")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="interleaved rounds [5]")
    args = parser.parse_args()
    gpu = args.device == "cuda"
    args.size = args.size or ("big" if gpu else "small")
    args.workers = args.workers or (torch.cuda.device_count() if gpu else 2)
    args.steps = args.steps or (20 if gpu else 4)
    args.max_tokens = args.max_tokens or (2 ** 13 if gpu else 2 ** 10)
    args.global_tokens = args.global_tokens or (2 ** 17 if gpu else 2 ** 11 * args.workers)
    machine = torch.cuda.get_device_name() if gpu else "CPU"
    print(machine_line(f"{machine} | torch {torch.__version__} | {args.repeats} interleaved rounds; median (range)"),
          flush=True)
    rounds = interleave({"plain": lambda: measure("plain", args), "mlbench": lambda: measure("mlbench", args)},
                        args.repeats)
    plain, ours = rounds["plain"], rounds["mlbench"]
    label = (f"transformer {args.size} ({ours[0][2] / 1e6:.1f} M params), {args.workers} worker(s), "
             f"{args.global_tokens} tokens/step in micro-batches of <= {args.max_tokens}, {ours[0][3]}")
    print(tabulate([[label, spread([r[0] for r in plain], "{:.3f}"), spread([r[1] for r in plain]),
                     spread([r[0] for r in ours], "{:.3f}"), spread([r[1] for r in ours]),
                     ratio_spread([r[0] for r in plain], [r[0] for r in ours])]],
                   headers=["task 4b step", "plain DDP s/step", "plain tokens/s", "mlbench s/step",
                            "mlbench tokens/s", "vs plain"], tablefmt="github", disable_numparse=True))


if __name__ == "__main__":
    main()

"""Step time and bytes sent of every distributed optimizer on task 1a, against plain PyTorch DDP.

    python benchmarks/optimizers.py                      # ResNet-20, 2 workers, CPU (gloo)
    python benchmarks/optimizers.py --device cuda        # on the GPU(s); nccl with >= 2 GPUs
    python benchmarks/optimizers.py --only powersgd ddp  # a subset

Every mlbench row is a real run through the launcher (`mlbench run task1a 2 --data synthetic
--optimizer NAME ...`, the processes and the trainer a user gets); its figures come from the
run's metric events, leaving out the first logging interval (warm-up): seconds per step (rank
0's training clock), the "communication" phase per step (mean over workers; for DDP only what
did not overlap the backward pass), bytes sent per step and worker, and how many times fewer
bytes than the reference all-reduce. The baseline is what a user writes from the PyTorch DDP
tutorial, in the same script: K processes, DistributedDataParallel(ResNet-20), torch.optim.SGD,
data already in memory (no augmentation, which favours the baseline); its bytes are DDP's
gradient all-reduce and buffer broadcast, counted as for mlbench's `ddp`.
"""

from __future__ import annotations

import argparse
import functools
import os
import queue
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from measure import DEFAULT_REPEATS, interleave, machine_line, ratio_spread, spread

from mlbench.optim.base import allreduce_bytes
from mlbench.results.environment import cpu_model, usable_cores
from mlbench.tasks.models import build_model, count_trainable_parameters
from mlbench.tasks.task1a import TASK1A

#: (label, optimizer, options): each optimizer at its defaults, plus the variants worth a row.
CASES = [
    ("centralized-sgd (reference)", "centralized-sgd", {}),
    ("centralized-sgd by=layer", "centralized-sgd", {"by": "layer"}),
    ("centralized-adam", "centralized-adam", {}),
    ("model-averaging", "model-averaging", {}),
    ("model-averaging period=4", "model-averaging", {"period": "4"}),
    ("powersgd rank=2", "powersgd", {"rank": "2"}),
    ("signsgd", "signsgd", {}),
    ("signsgd error_feedback", "signsgd", {"error_feedback": "true"}),
    ("sparsified-sgd topk 1%", "sparsified-sgd", {}),
    ("sparsified-sgd randomk 1%", "sparsified-sgd", {"method": "randomk"}),
    ("decentralized-sgd ring", "decentralized-sgd", {}),
    ("ddp", "ddp", {}),
    ("ddp hook=fp16", "ddp", {"hook": "fp16"}),
    ("ddp hook=powersgd rank=2", "ddp", {"hook": "powersgd"}),
]


def mlbench_row(label: str, optimizer: str, options: dict[str, str], *, workers: int, steps: int,
                interval: int, device: str, backend: str, network=None, data_dir: str | None = None) -> list:
    """One optimizer's row; ``network`` (NetworkSettings) emulates one, ``data_dir`` replaces the
    synthetic data by a CIFAR-10 folder (benchmarks/network.py: a tiny test set)."""
    from mlbench.launch.plan import RunRequest
    from mlbench.launch.registry import choose
    from mlbench.results.events import read_run_events
    from mlbench.results.store import RunStore

    store = RunStore()
    launcher = choose(store, {})  # this machine's processes, as `mlbench run`
    run = launcher.create(RunRequest(task="task1a", workers=workers, data="real" if data_dir else "synthetic",
                                     data_dir=data_dir, device=device, backend=backend, optimizer=optimizer,
                                     optimizer_options=options, max_steps=steps + interval,
                                     log_every=interval, network=network))
    final = launcher.run_attached(run)
    if final.state != "finished":
        return [label, f"{final.state}: {final.reason}", "", "", "", ""]
    events = [e for e in read_run_events(final.run_dir) if e["step"] > interval]
    clock = [(e["step"], e["value"]) for e in read_run_events(final.run_dir)
             if e["name"] == "train/time" and e["rank"] == 0]
    (s0, t0), (s1, t1) = clock[0], clock[-1]
    per_step = (t1 - t0) / (s1 - s0)

    def per_rank_step(name: str) -> float:
        return sum(e["value"] for e in events if e["name"] == name) / workers / (s1 - s0)

    sent, dense = per_rank_step("comm/bytes"), per_rank_step("comm/dense_bytes")
    return [label, per_step * 1e3, per_rank_step("time/communication") * 1e3, sent / 1e3,
            dense / sent if sent else float("inf")]


def _plain_ddp_worker(rank: int, workers: int, store: str, device: str, backend: str, steps: int,
                      warmup: int, out) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(max(1, usable_cores() // workers) if device == "cpu" else 1)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=workers)
    dev = torch.device("cuda", rank % torch.cuda.device_count()) if device == "cuda" else torch.device("cpu")
    torch.manual_seed(0)
    model = build_model(TASK1A.model).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=TASK1A.momentum, nesterov=TASK1A.nesterov,
                          weight_decay=TASK1A.weight_decay)
    x = torch.randn(1024, 3, 32, 32, device=dev)
    y = torch.randint(0, 10, (1024,), device=dev)
    batch = TASK1A.batch_per_worker
    for i in range(warmup + steps):
        if i == warmup:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            dist.barrier()
            start = time.perf_counter()
        idx = torch.randint(0, 1024, (batch,), device=dev)
        loss = torch.nn.functional.cross_entropy(ddp(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    elapsed = torch.tensor([time.perf_counter() - start])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    if rank == 0:
        out.put(float(elapsed) / steps)
    dist.destroy_process_group()


def plain_ddp_row(*, workers: int, steps: int, warmup: int, device: str, backend: str) -> list:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_plain_ddp_worker,
                             args=(r, workers, store, device, backend, steps, warmup, out)) for r in range(workers)]
        for p in procs:
            p.start()
        while True:
            try:
                per_step = out.get(timeout=5)
                break
            except queue.Empty:
                failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if failed:
                    raise RuntimeError(f"a plain DDP worker exited with code {failed[0]}") from None
        for p in procs:
            p.join()
    sent, dense = plain_ddp_bytes(workers)
    return ["plain PyTorch DDP (tutorial loop)", per_step * 1e3, "-", sent / 1e3, dense / sent]


def plain_ddp_bytes(workers: int) -> tuple[int, int]:
    """(bytes DDP sends per step and worker: gradients + BatchNorm buffers, the gradients alone)."""
    model = build_model(TASK1A.model)
    dense = allreduce_bytes(count_trainable_parameters(model), 4, workers)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers()) * (workers - 1) // workers
    return dense + buffers, dense


def _aggregate(label: str, rows: list[list], base: list[float]) -> list[str]:
    """One table row from a case's rounds: the median (range) of ms/step, the ratio to the plain
    DDP loop of the same round, the medians of the rest (bytes are the same every round)."""
    if any(isinstance(r[1], str) for r in rows):   # a run that did not finish: say how
        return next(r for r in rows if isinstance(r[1], str))
    ms = [r[1] for r in rows]
    comm = [r[2] for r in rows if not isinstance(r[2], str)]
    return [label, spread(ms, "{:.1f}"), ratio_spread(ms, base), spread(comm, "{:.1f}") if comm else "-",
            f"{statistics.median(r[3] for r in rows):,.1f}", f"{statistics.median(r[4] for r in rows):.1f}x"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60, help="timed steps per run (after one interval of warm-up)")
    parser.add_argument("--interval", type=int, default=10, help="logging interval; the first is warm-up")
    parser.add_argument("--only", nargs="*", help="optimizer names to run (default: all)")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="interleaved rounds [5]")
    args = parser.parse_args()
    backend = "nccl" if args.device == "cuda" and torch.cuda.device_count() >= args.workers else "gloo"
    if not os.environ.get("MLBENCH_HOME"):   # a fresh store unless one is given (never an empty folder left)
        os.environ["MLBENCH_HOME"] = tempfile.mkdtemp(prefix="mlbench-bench-")
    machine = (f"{torch.cuda.get_device_name()} x {torch.cuda.device_count()}" if args.device == "cuda"
               else f"{cpu_model()}, {usable_cores()} cores")
    print(machine_line(f"{machine} | torch {torch.__version__} | task1a ResNet-20, batch 32 per worker, "
                       f"{args.workers} workers, {args.device}/{backend}, {args.steps} timed steps, "
                       f"{args.repeats} interleaved rounds"))
    cases = {"plain": lambda: plain_ddp_row(workers=args.workers, steps=args.steps, warmup=args.interval,
                                            device=args.device, backend=backend)}
    for label, optimizer, options in CASES:
        if args.only and optimizer not in args.only:
            continue
        cases[label] = functools.partial(mlbench_row, label, optimizer, options, workers=args.workers,
                                         steps=args.steps, interval=args.interval, device=args.device,
                                         backend=backend)
    rounds = interleave(cases, args.repeats)
    base = [r[1] for r in rounds["plain"]]
    table = [_aggregate(rounds["plain"][0][0], rounds["plain"], base)]
    table[0][2] = "1.00x"
    table += [_aggregate(label, rows, base) for label, rows in rounds.items() if label != "plain"]
    print(tabulate(table, headers=["optimizer", "ms/step", "vs plain DDP", "comm ms/step",
                                   "KB sent/step/worker", "fewer bytes than all-reduce"],
                   tablefmt="github", disable_numparse=True))


if __name__ == "__main__":
    main()

"""Training-step throughput: mlbench's reference step vs a plain PyTorch loop, in one run.

    python benchmarks/throughput.py                # GPU if visible, else CPU
    python benchmarks/throughput.py --device cpu --steps 60 --repeats 5

The plain loop is what a user writes from the PyTorch tutorials: the model, autograd,
torch.optim.SGD (momentum 0.9, Nesterov, weight decay 1e-4), data already in memory (synthetic,
CIFAR-shaped, normalised; no augmentation, which favours the baseline). mlbench's step does
more: it gathers the minibatch and augments it (crop + flip) on the device, times every phase,
and (on a GPU) runs the whole step as one CUDA graph. On the CPU, mlbench runs K worker
processes through the real launcher (`mlbench run task1a K --data synthetic`), against a plain
single process that uses every core.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from measure import DEFAULT_REPEATS, interleave, machine_line, ratio_spread, spread

from mlbench.results.events import EventWriter
from mlbench.run_config import RunConfig
from mlbench.tasks.losses import get_loss
from mlbench.tasks.models import build_model
from mlbench.tasks.overrides import resolve
from mlbench.tasks.task1a import TASK1A
from mlbench.tasks.task2a import TASK2A
from mlbench.worker.trainer import Trainer


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(step, steps: int, device: torch.device, warmup: int = 20) -> float:
    """Seconds per step over ``steps`` steps, after ``warmup`` untimed ones."""
    for i in range(warmup):
        step(i)
    sync(device)
    start = time.perf_counter()
    for i in range(steps):
        step(i)
    sync(device)
    return (time.perf_counter() - start) / steps


def plain_loop(model_name: str, batch: int, device: torch.device, precision: str, channels_last: bool,
               features: int = 2000):
    """The tutorial loop: returns step(i)."""
    torch.manual_seed(0)
    spec = TASK2A if model_name == "logreg" else TASK1A
    model = build_model(model_name, in_features=features).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=spec.momentum, nesterov=spec.nesterov,
                          weight_decay=spec.weight_decay)
    n = 8192
    if model_name == "logreg":
        x = torch.randn(n, features, device=device)
        y = torch.randint(0, 2, (n,), device=device).float() * 2 - 1
    else:
        x = torch.randn(n, 3, 32, 32, device=device)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 10, (n,), device=device)
    order = torch.randint(0, n, (10_000, batch), device=device)

    def step(i: int) -> None:
        idx = order[i % order.shape[0]]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = model(x[idx])
            loss = get_loss(spec.loss).value(out, y[idx], "mean")
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def mlbench_step(model_name: str, batch: int, device: torch.device, precision: str, channels_last: bool,
                 timing: bool = True, graph: bool = True):
    """mlbench's reference step (the same code the workers run), on synthetic data of the task."""
    torch.manual_seed(0)
    base = TASK2A if model_name == "logreg" else TASK1A
    spec, _ = resolve(base, {"batch_per_worker": batch, "model": model_name})
    config = RunConfig(task=spec, workers=1, data="synthetic", device=device.type, precision=precision,
                       channels_last=channels_last, timing=timing, graph=graph)
    trainer = Trainer(config, 0, EventWriter(_Discard(), 0))
    trainer.setup()
    trainer.runtime.begin_epoch(0)
    runtime, optimizer, timer = trainer.runtime, trainer.optimizer, trainer.timer
    order = torch.randint(0, runtime.train_samples, (10_000, batch), device=device)
    collect_every = 50

    def step(i: int) -> None:
        runtime.train_step(order[i % order.shape[0]], 0.01, optimizer)
        if timing and i % collect_every == collect_every - 1:
            timer.collect()
    return step


class _Discard:
    """An event sink that keeps nothing (the benchmark times steps, it records no run)."""

    def write(self, event) -> None:
        pass

    def close(self) -> None:
        pass


def gpu_table(steps: int, repeats: int) -> list[list]:
    """Per case: the plain loop, mlbench's step and mlbench's step without phase timing, in
    interleaved rounds (benchmarks/measure.py); each step function is built once per case and
    timed anew in every round."""
    device = torch.device("cuda")
    cases = [("resnet20-v1", 32, "fp32", False), ("resnet20-v1", 32, "bf16", True),
             ("resnet20-v1", 512, "bf16", True), ("logreg", 100, "fp32", False)]
    rows = []
    for model, batch, precision, cl in cases:
        steps_of = {"plain": plain_loop(model, batch, device, precision, cl),
                    "mlbench": mlbench_step(model, batch, device, precision, cl),
                    "untimed": mlbench_step(model, batch, device, precision, cl, timing=False)}
        seconds = interleave({name: (lambda f=f: timed(f, steps, device)) for name, f in steps_of.items()}, repeats)
        base, ours, untimed = seconds["plain"], seconds["mlbench"], seconds["untimed"]
        label = f"{model}, batch {batch}, {precision}{' + channels-last' if cl else ''}"
        cost = [100 * (o / u - 1) for o, u in zip(ours, untimed, strict=True)]
        rows.append([label, spread([batch / s for s in base]), spread([batch / s for s in ours]),
                     ratio_spread(base, ours), f"{statistics.median(cost):+.1f}%"])
    return rows


def cpu_table(steps: int, repeats: int) -> list[list]:
    """Plain single process on all cores vs `mlbench run task1a K --data synthetic
    --threads-per-worker CORES/K` (the same cores), in interleaved rounds: each round times the
    plain loop and then one real run per K."""
    from mlbench.launch.plan import RunRequest
    from mlbench.launch.registry import choose
    from mlbench.results.events import read_run_events
    from mlbench.results.store import RunStore

    device = torch.device("cpu")
    threads = torch.get_num_threads()
    plain_step = plain_loop("resnet20-v1", 32, device, "fp32", False)
    store = RunStore()
    launcher = choose(store, {})  # this machine's processes, as `mlbench run`

    def plain() -> float:
        return 32 / timed(plain_step, steps, device, warmup=5)

    def threads_of(workers: int) -> int:
        """The workers share the plain loop's cores (mlbench's default is one thread each)."""
        return max(1, threads // workers)

    def run(workers: int) -> float:
        record = launcher.create(RunRequest(task="task1a", workers=workers, data="synthetic",
                                            max_steps=steps + 5, log_every=5,
                                            threads_per_worker=threads_of(workers)))
        final = launcher.run_attached(record)
        # rank 0's training clock at every logging interval; the first interval is warm-up
        clock = [(e["step"], e["value"]) for e in read_run_events(final.run_dir)
                 if e["name"] == "train/time" and e["rank"] == 0]
        (s0, t0), (s1, t1) = clock[0], clock[-1]
        return (s1 - s0) * 32 * workers / (t1 - t0)

    rates = interleave({"plain": plain, 1: lambda: run(1), 2: lambda: run(2)}, repeats)
    rows = [[f"plain PyTorch, 1 process x {threads} threads", spread(rates["plain"]), "1.00x"]]
    for workers in (1, 2):
        rows.append([f"mlbench run task1a {workers} (processes x threads: {workers} x "
                     f"{threads_of(workers)})", spread(rates[workers]),
                     ratio_spread(rates[workers], rates["plain"])])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    args = parser.parse_args()
    machine = torch.cuda.get_device_name() if args.device == "cuda" else ""
    print(machine_line(f"{machine + ' | ' if machine else ''}torch {torch.__version__} | "
                       f"{args.repeats} interleaved rounds"))
    if args.device == "cuda":
        rows = gpu_table(args.steps or 500, args.repeats)
        print(tabulate(rows, headers=["step", "plain img/s", "mlbench img/s", "speed-up",
                                      "timing cost (median)"], tablefmt="github"))
    else:
        rows = cpu_table(args.steps or 60, args.repeats)
        print(tabulate(rows, headers=["ResNet-20, batch 32 per worker", "samples/s", "vs plain"],
                       tablefmt="github"))


if __name__ == "__main__":
    main()

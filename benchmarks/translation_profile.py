"""Where task 4b's training step spends its time: a profile of mlbench's step and one micro-batch's variants.

    python benchmarks/translation_profile.py                    # GPU if visible (full model)
    python benchmarks/translation_profile.py --device cpu --size small --max-tokens 1024 --global-tokens 4096

``benchmarks/translation.py`` says how fast a step is against a plain DDP loop; this script says
why, for one process (world 1) on the task-4b runtime and ``centralized-adam``:

1. **The step by phase**: the micro-batches' forwards, backwards and the optimizer's update,
   each closed by a device synchronisation, median over ``--steps`` steps after ``--warmup``,
   with the model's attention kernels (``ATTENTION_KERNELS``) and, step by step interleaved,
   with torch's default choice (on Hopper: cuDNN's kernel first); the micro-batches' shapes
   (sentences x longest source / target) and their padding.
2. **The operators**: one step under ``torch.profiler``, the top operators by their own device
   time and by their own host time, and the share of the step's wall time the device was busy
   (the sum of kernel times over the wall time: far below 1 means the host sets the pace).
3. **Variants of one micro-batch** (forward + backward of the step's largest micro-batch, timed
   the same way): as the runtime runs it, without attention dropout, without any dropout, with
   each attention kernel forced (flash, memory-efficient, math, cuDNN), in fp32, and in fp32 with
   TF32 matrix products. A micro-batch repeated has one shape, so a kernel with a per-shape host
   cost (cuDNN's) looks better here than in the step, whose micro-batches all differ. The
   FLOP/s column uses the runtime's analytic count (3 x the forward).

The first line names the date, machine and torch.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import machine_line
from translation import SIZES, SPEC, settings

from mlbench.optim.base import OptimizerContext
from mlbench.optim.catalog import build_optimizer
from mlbench.tasks.flops import transformer_flops
from mlbench.tasks.precision import autocast, autocast_off
from mlbench.tasks.task4b import model as model_module
from mlbench.tasks.task4b.bpe import PAD
from mlbench.tasks.task4b.runtime import MicroBatch, TranslationRuntime, TranslationStep
from mlbench.timing import PhaseTimer
from mlbench.worker.hyper import task_hyper


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_by_phase(runtime: TranslationRuntime, opt, batch: TranslationStep, lr: float) -> dict[str, float]:
    """One training step as ``runtime.train_step`` runs it (one autocast context for the step's
    forwards, each backward with autocast off), synchronised after every phase: seconds per phase."""
    device, phases = runtime.device, {"forward": 0.0, "backward": 0.0, "update": 0.0}
    sync(device)
    begin = time.perf_counter()
    opt.zero_grad()
    with autocast(device, runtime.precision):
        for mb in batch.micro:
            t0 = time.perf_counter()
            logits = runtime.model(mb.src, mb.tgt_in)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), mb.tgt_out.reshape(-1), ignore_index=PAD,
                                   label_smoothing=runtime.s.label_smoothing, reduction="sum")
            sync(device)
            t1 = time.perf_counter()
            with autocast_off(device, runtime.precision):
                (loss * (runtime.world / batch.total_tokens)).backward()
            sync(device)
            t2 = time.perf_counter()
            phases["forward"] += t1 - t0
            phases["backward"] += t2 - t1
    t3 = time.perf_counter()
    opt.step(lr)
    sync(device)
    phases["update"] = time.perf_counter() - t3
    phases["step"] = time.perf_counter() - begin
    return phases


def micro_flops(runtime: TranslationRuntime, mb: MicroBatch) -> int:
    s = runtime.s
    return 3 * transformer_flops(mb.src.size(0), mb.src.size(1), mb.tgt_in.size(1), dim=s.dim, ffn=s.ffn,
                                 encoder_layers=s.encoder_layers, decoder_layers=s.decoder_layers,
                                 vocab=runtime.vocab_size)


def time_micro(runtime: TranslationRuntime, mb: MicroBatch, precision: str, repeats: int,
               context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext) -> float:
    """Median seconds of one forward + backward of ``mb`` (after one untimed pass)."""
    device, model, times = runtime.device, runtime.model, []
    for i in range(repeats + 1):
        model.zero_grad(set_to_none=True)
        sync(device)
        begin = time.perf_counter()
        with context(), autocast(device, precision):
            logits = model(mb.src, mb.tgt_in)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), mb.tgt_out.reshape(-1), ignore_index=PAD,
                                   label_smoothing=runtime.s.label_smoothing, reduction="sum")
        with context():
            loss.backward()
        sync(device)
        if i:
            times.append(time.perf_counter() - begin)
    return statistics.median(times)


@contextlib.contextmanager
def dropouts(model: torch.nn.Module, *, attention: float | None = None, others: float | None = None) -> Iterator[None]:
    """Temporarily set the attention-weight dropout and/or every other dropout rate of the Transformer."""
    saved: list[tuple[torch.nn.Module, str, float]] = []
    for module in model.modules():
        is_attention = type(module).__name__ == "Attention"
        rate = attention if is_attention else others
        for name in ("dropout", "activation_dropout"):
            if rate is not None and isinstance(getattr(module, name, None), float):
                saved.append((module, name, getattr(module, name)))
                setattr(module, name, rate)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


@contextlib.contextmanager
def kernels_replaced(names: list[str]) -> Iterator[None]:
    """The Transformer's attention kernels replaced by ``names`` (SDPBackend members) for a while."""
    from torch.nn.attention import SDPBackend
    saved = model_module.ATTENTION_KERNELS
    model_module.ATTENTION_KERNELS = [getattr(SDPBackend, name) for name in names]
    try:
        yield
    finally:
        model_module.ATTENTION_KERNELS = saved


TORCH_DEFAULT = ["CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"]  # all allowed: torch's order


@contextlib.contextmanager
def tf32() -> Iterator[None]:
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def profile_step(runtime: TranslationRuntime, opt, batch: TranslationStep, lr: float, rows: int,
                 trace: Path | None) -> None:
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if runtime.device.type == "cuda" else [])
    sync(runtime.device)
    begin = time.perf_counter()
    with profile(activities=activities) as prof:
        runtime.train_step(batch, lr, opt)
        sync(runtime.device)
    wall = time.perf_counter() - begin
    averages = prof.key_averages()
    if runtime.device.type == "cuda":
        busy = sum(e.self_device_time_total for e in averages) / 1e6
        print(f"\nprofiled step: {wall:.3f} s wall, device busy {busy:.3f} s ({busy / wall:.0%}) "
              f"(profiler overhead included)")
        print(averages.table(sort_by="self_cuda_time_total", row_limit=rows, max_name_column_width=60))
    print(averages.table(sort_by="self_cpu_time_total", row_limit=rows // 2, max_name_column_width=60))
    if trace is not None:
        prof.export_chrome_trace(str(trace))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", choices=list(SIZES), default="big")
    parser.add_argument("--steps", type=int, default=5, help="timed steps of each attention choice, interleaved")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=2 ** 13)
    parser.add_argument("--global-tokens", type=int, default=2 ** 17)
    parser.add_argument("--pairs", type=int, default=20_000, help="synthetic sentence pairs")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per micro-batch variant")
    parser.add_argument("--rows", type=int, default=25, help="operators listed")
    parser.add_argument("--trace", type=Path, default=None, help="write the profiled step's Chrome trace here")
    args = parser.parse_args()
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=0, world_size=1)
    machine = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(machine_line(f"{machine} | torch {torch.__version__} | world 1"), flush=True)
    runtime = TranslationRuntime(settings(args), synthetic=True, device=device)
    opt = build_optimizer("centralized-adam", OptimizerContext(
        model=runtime.model, hyper=task_hyper(SPEC, 1), world_size=1, rank=0,
        timer=PhaseTimer(device, enabled=False)))
    params = sum(p.numel() for p in runtime.model.parameters())
    print(f"transformer {args.size}: {params / 1e6:.1f} M parameters, {runtime.precision}, "
          f"{args.global_tokens} tokens per step in micro-batches of <= {args.max_tokens}", flush=True)

    batches = runtime.batches(0)
    draw: list[float] = []
    phases: dict[str, list[dict[str, float]]] = {"model's kernels": [], "torch's default choice": []}
    for i in range(args.warmup + args.steps):
        for label, kernels in (("model's kernels", None), ("torch's default choice", TORCH_DEFAULT)):
            t0 = time.perf_counter()
            batch = next(batches)
            draw.append(time.perf_counter() - t0)
            with kernels_replaced(kernels) if kernels else contextlib.nullcontext():
                result = step_by_phase(runtime, opt, batch, runtime.lr(1000 + i))
            if i >= args.warmup:
                phases[label].append(result)
    shapes = [(mb.src.size(0), mb.src.size(1), mb.tgt_in.size(1), mb.tokens) for mb in batch.micro]
    padded = sum(n * max(s, t) for n, s, t, _ in shapes)
    print(f"\n{len(shapes)} micro-batches: sentences x source x target {[s[:3] for s in shapes]}")
    print(f"target tokens {sum(s[3] for s in shapes)}, padded slots (sentences x longest side) {padded}")
    step_flops = sum(micro_flops(runtime, mb) for mb in batch.micro)
    print(f"step FLOPs (3 x forward, padded shapes) {step_flops / 1e12:.1f} T")
    labels = list(phases)
    rows = [[name] + [f"{statistics.median(p[name] for p in phases[label]):.3f}" for label in labels]
            for name in ("forward", "backward", "update", "step")]
    rows.append(["TFLOP/s"] + [f"{step_flops / statistics.median(p['step'] for p in phases[label]) / 1e12:.1f}"
                               for label in labels])
    print(tabulate(rows, headers=["phase (synchronised), seconds"] + labels, tablefmt="github",
                   disable_numparse=True))
    print(f"drawing a step's batch (collate + copy): {statistics.median(draw):.3f} s", flush=True)

    profile_step(runtime, opt, next(batches), runtime.lr(1000), args.rows, args.trace)

    mb = max(batch.micro, key=lambda m: m.src.numel() + m.tgt_in.numel())
    flops = micro_flops(runtime, mb)
    model = runtime.model
    variants: list[tuple[str, str, Callable[[], contextlib.AbstractContextManager]]] = [
        ("as the runtime runs it", runtime.precision, contextlib.nullcontext),
        ("no attention dropout", runtime.precision, lambda: dropouts(model, attention=0.0)),
        ("no dropout at all", runtime.precision, lambda: dropouts(model, attention=0.0, others=0.0)),
    ]
    if device.type == "cuda":
        for backend in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH", "CUDNN_ATTENTION"):
            variants.append((f"attention kernel {backend}", runtime.precision,
                             lambda backend=backend: kernels_replaced([backend])))
        variants.append(("fp32", "fp32", contextlib.nullcontext))
        variants.append(("fp32 with TF32 matrix products", "fp32", tf32))
    table = []
    print(f"\nvariants of one micro-batch {tuple(mb.src.shape)} -> {tuple(mb.tgt_in.shape)} "
          f"({flops / 1e12:.2f} TFLOP forward + backward)", flush=True)
    for label, precision, context in variants:
        try:
            seconds = time_micro(runtime, mb, precision, args.repeats, context)
            table.append([label, precision, f"{seconds * 1e3:.1f}", f"{flops / seconds / 1e12:.1f}"])
        except RuntimeError as error:  # a forced attention kernel that cannot run these inputs
            table.append([label, precision, "-", str(error).splitlines()[0][:70]])
        print(table[-1], flush=True)
    print(tabulate(table, headers=["micro-batch variant", "precision", "ms fwd+bwd", "TFLOP/s"],
                   tablefmt="github", disable_numparse=True))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

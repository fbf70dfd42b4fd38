"""Task 0a: the all-reduce micro-benchmark of the communication backend (gloo, nccl, mpi).

Every synchronous method rests on one collective, so its latency and bandwidth bound what any
optimizer can gain on a given machine and network. The sweep all-reduces (sum) messages of
1, 10, ..., 10^8 elements (``--max-size`` caps it; a cap that is not a power of ten is measured
too) in fp32, fp16 and bf16 on every worker, and reports per size the quantities of NVIDIA's
nccl-tests ("Performance reported by NCCL tests", nccl-tests/doc/PERFORMANCE.md):

- time: the mean over ranks of each rank's mean time per operation, over back-to-back timed
  operations after warm-up (the max over ranks is kept too);
- algorithm bandwidth ``algbw = S / t`` with S the message size in bytes;
- bus bandwidth ``busbw = algbw * 2 (n - 1) / n``: the rate at which each link must carry data for
  a ring all-reduce to reach that algbw, comparable across worker counts and with the hardware's
  peak (0 on one worker, where nothing travels).

Warm-up and repetitions adapt to the message: the first operation of each size is timed, the
ranks agree on the slowest estimate, and then run up to ``warmup`` warm-up operations and up to
``iterations`` timed ones within about ``seconds_per_size``, so the sweep to 10^8 takes seconds
on a laptop yet small messages are averaged over many repetitions. The first operation also
checks the result (ones summed over n ranks equal n), like nccl-tests' #wrong column.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import torch
import torch.distributed as dist

from mlbench.errors import UsageError
from mlbench.results.events import EventWriter
from mlbench.tasks.spec import TaskSpec
from mlbench.worker.config import RunConfig

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
#: Repetitions never drop below this, however large the message.
MIN_ITERATIONS = 2


def message_sizes(max_size: int) -> list[int]:
    """1, 10, 100, ... up to ``max_size``, and ``max_size`` itself."""
    sizes = [10**e for e in range(int(math.log10(max_size)) + 2) if 10**e <= max_size]
    return sizes if sizes[-1] == max_size else sizes + [max_size]


def bus_factor(world: int) -> float:
    """nccl-tests' all-reduce correction from algorithm to bus bandwidth: 2 (n - 1) / n."""
    return 2 * (world - 1) / world


def with_max_size(spec: TaskSpec, max_size: float) -> tuple[TaskSpec, list[str]]:
    """The benchmark spec with its sweep capped at ``max_size`` elements (the changed values)."""
    if spec.kind != "allreduce":
        raise UsageError(f"--max-size applies to the all-reduce benchmark task0a, not to {spec.name}")
    if not float(max_size).is_integer() or max_size < 1 or max_size > 10**10:
        raise UsageError(f"--max-size {max_size:g}: expected a whole number of elements from 1 to 1e10")
    size = int(max_size)
    if size == spec.extra["max_size"]:
        return spec, []
    return dataclasses.replace(spec, extra={**spec.extra, "max_size": size}), [f"max_size={size}"]


def _device(config: RunConfig, rank: int) -> torch.device:
    if config.device == "cuda":
        index = rank % max(1, torch.cuda.device_count())
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def _agree(values: list[float], op: dist.ReduceOp, world: int, device: torch.device) -> list[float]:
    """The all-reduced (``op`` over ranks) values, so that every rank takes the same decision."""
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if world > 1:
        dist.all_reduce(tensor, op=op)
    return tensor.tolist()


def _timed(tensor: torch.Tensor, count: int, world: int) -> float:
    """Seconds per operation of ``count`` back-to-back all-reduces, started together."""
    if world > 1:
        dist.barrier()
    begin = time.perf_counter()
    for _ in range(count):
        dist.all_reduce(tensor)
    if tensor.is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - begin) / count


def measure(buffer: torch.Tensor, elements: int, params: dict[str, Any], world: int) -> dict[str, Any]:
    """One size of one dtype: warm-up, check, timed repetitions, and the nccl-tests figures."""
    tensor = buffer[:elements]
    tensor.fill_(1)
    first = _timed(tensor, 1, world)
    wrong = int((tensor != world).sum())
    tensor.zero_()  # zeros stay zeros: no overflow or denormals in the timed operations
    (estimate,) = _agree([first], dist.ReduceOp.MAX, world, tensor.device)
    budget = params["seconds_per_size"]
    warmup = int(min(params["warmup"] - 1, budget / 4 / max(estimate, 1e-9)))
    iterations = int(max(MIN_ITERATIONS, min(params["iterations"], budget / max(estimate, 1e-9))))
    if warmup > 0:
        _timed(tensor, warmup, world)
    seconds = _timed(tensor, iterations, world)
    total, wrong_total = _agree([seconds, wrong], dist.ReduceOp.SUM, world, tensor.device)
    (slowest,) = _agree([seconds], dist.ReduceOp.MAX, world, tensor.device)
    mean = total / world
    size_bytes = elements * tensor.element_size()
    algbw = size_bytes / mean / 1e9
    return {"elements": elements, "bytes": size_bytes, "iterations": iterations, "time_s": mean,
            "time_max_s": slowest, "algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor(world),
            "wrong": int(wrong_total)}


def run_benchmark(config: RunConfig, rank: int, events: EventWriter) -> dict[str, Any]:
    """The sweep on this rank (all ranks call it together); rank 0 records every measurement.

    Returns the run's result: the rows, plus the fields every result has (no goal; "steps" counts
    the timed operations).
    """
    params = config.task.extra
    world = config.workers
    device = _device(config, rank)
    sizes = message_sizes(int(params["max_size"]))
    begin = time.perf_counter()
    rows = []
    operations = 0
    for name in params["dtypes"]:
        buffer = torch.zeros(sizes[-1], dtype=DTYPES[name], device=device)
        for elements in sizes:
            row = {"dtype": name, **measure(buffer, elements, params, world)}
            operations += row["iterations"]
            rows.append(row)
            if rank == 0:
                events.emit("allreduce", row, epoch=0, step=len(rows))
        del buffer
    wrong = sum(row["wrong"] for row in rows)
    return {"goal": None, "kind": "allreduce", "backend": config.backend, "device": config.device,
            "workers": world, "rows": rows, "wrong": wrong, "steps": operations, "epochs": 0.0,
            "train_time": time.perf_counter() - begin, "eval_time": 0.0,
            "stop_reason": "sweep complete" if wrong == 0 else f"{wrong} wrong elements"}


TABLE_HEADERS = ("dtype", "elements", "bytes", "reps", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong")


def table_row(row: dict[str, Any]) -> list[Any]:
    """One measurement as the terminal shows it (nccl-tests' columns)."""
    return [row["dtype"], row["elements"], row["bytes"], row["iterations"], f"{row['time_s'] * 1e6:.1f}",
            f"{row['algbw_gbps']:.3f}", f"{row['busbw_gbps']:.3f}", row["wrong"]]


def peak(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The measurement with the highest bus bandwidth (algorithm bandwidth on one worker)."""
    return max(rows, key=lambda r: (r["busbw_gbps"], r["algbw_gbps"]), default=None)

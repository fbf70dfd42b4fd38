"""The all-reduce sweep of task 0a as one worker runs it (the definition: :mod:`.sweep`).

Warm-up and repetitions adapt to the message: the first operation of each size is timed, the
ranks agree on the slowest estimate, and then run up to ``warmup`` warm-up operations and up to
``iterations`` timed ones within about ``seconds_per_size``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch
import torch.distributed as dist

from mlbench.tasks.runtime import EventSink, RunView
from mlbench.tasks.spec import AllreduceSpec
from mlbench.tasks.task0a.sweep import bus_factor, message_sizes

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
#: Repetitions never drop below this, however large the message.
MIN_ITERATIONS = 2


def _device(config: RunView, rank: int) -> torch.device:
    if config.device == "cuda":
        index = rank % max(1, torch.cuda.device_count())
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def _agree(values: list[float], op: dist.ReduceOp.RedOpType, world: int, device: torch.device) -> list[float]:
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


def run_benchmark(config: RunView, rank: int, events: EventSink) -> dict[str, Any]:
    """The sweep on this rank (all ranks call it together); rank 0 records every measurement.

    Returns the run's result: the rows, plus the fields every result has (no goal; "steps" counts
    the timed operations).
    """
    spec = config.task
    assert isinstance(spec, AllreduceSpec)
    params = dataclasses.asdict(spec)
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

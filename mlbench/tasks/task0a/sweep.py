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

This module holds the definition (sizes, bandwidth formulas, the table); the measurement that
each worker runs is :mod:`.runtime`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from mlbench.errors import UsageError
from mlbench.tasks.spec import AllreduceSpec, AnySpec


def message_sizes(max_size: int) -> list[int]:
    """1, 10, 100, ... up to ``max_size``, and ``max_size`` itself."""
    sizes = [10**e for e in range(int(math.log10(max_size)) + 2) if 10**e <= max_size]
    return sizes if sizes[-1] == max_size else sizes + [max_size]


def bus_factor(world: int) -> float:
    """nccl-tests' all-reduce correction from algorithm to bus bandwidth: 2 (n - 1) / n."""
    return 2 * (world - 1) / world


def with_max_size(spec: AnySpec, max_size: float) -> tuple[AllreduceSpec, list[str]]:
    """The benchmark spec with its sweep capped at ``max_size`` elements (the changed values)."""
    if not isinstance(spec, AllreduceSpec):
        raise UsageError(f"--max-size applies to the all-reduce benchmark task0a, not to {spec.name}")
    if not float(max_size).is_integer() or max_size < 1 or max_size > 10**10:
        raise UsageError(f"--max-size {max_size:g}: expected a whole number of elements from 1 to 1e10")
    size = int(max_size)
    if size == spec.max_size:
        return spec, []
    return dataclasses.replace(spec, max_size=size), [f"max_size={size}"]


TABLE_HEADERS = ("dtype", "elements", "bytes", "reps", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong")


def table_row(row: dict[str, Any]) -> list[Any]:
    """One measurement as the terminal shows it (nccl-tests' columns). Bandwidths keep four
    significant digits: a fixed three decimals (nccl-tests' GPU scale) would print the
    kilobyte-per-second rates of small messages on a CPU or a slow emulated link as 0.000."""
    return [row["dtype"], row["elements"], row["bytes"], row["iterations"], f"{row['time_s'] * 1e6:.1f}",
            gbps_cell(row["algbw_gbps"]), gbps_cell(row["busbw_gbps"]), row["wrong"]]


def gbps_cell(value: float) -> str:
    """A bandwidth in GB/s for a table cell: '12.35', '0.002994', '1.432e-05'."""
    return f"{value:.4g}"


def peak(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The measurement with the highest bus bandwidth (algorithm bandwidth on one worker)."""
    return max(rows, key=lambda r: (r["busbw_gbps"], r["algbw_gbps"]), default=None)

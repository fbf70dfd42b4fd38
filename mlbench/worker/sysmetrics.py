"""What a worker measures about the machine it trains on: peak memory, the device's peak FLOP/s
and the FLOPs of its step, recorded per rank as the ``system`` event (docs/system-metrics.md);
and, with every logging interval, its memory and CPU use then (:class:`IntervalSampler`, the
``sys/`` events: the run page's System chart).

The peak FLOP/s is the denominator of the utilisation. A GPU's comes from its data sheet
(:data:`GPU_PEAKS`, dense, without sparsity, for the run's precision); a CPU has no data sheet
worth trusting (turbo, AVX frequency, the threads a run gets), so each worker measures one with a
short matrix-product probe at start (:func:`cpu_peak_flops`) and records it with the run: the
utilisation is then against what this machine reached with the run's threads, not a catalogue.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

#: Dense peak FLOP/s per GPU model by precision (NVIDIA's data sheets, no sparsity): ``fp32`` is
#: plain FP32 (torch's default matmul precision), ``tf32`` where torch's matmul precision allows
#: it, ``bf16`` the tensor cores' (``fp16`` runs at bf16's rate on every GPU that has both, so it
#: is listed only for the V100, which has no bf16). Matched in order by a substring of
#: ``torch.cuda.get_device_name``.
GPU_PEAKS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 PCIe", {"fp32": 51.2e12, "tf32": 378e12, "bf16": 756e12}),
    ("H100 NVL", {"fp32": 60e12, "tf32": 417.5e12, "bf16": 835e12}),
    ("H100", {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12}),
    ("H200", {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12}),
    ("A100", {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12}),
    ("L40S", {"fp32": 91.6e12, "tf32": 183e12, "bf16": 362e12}),
    ("L4", {"fp32": 30.3e12, "tf32": 60e12, "bf16": 121e12}),
    ("A10", {"fp32": 31.2e12, "tf32": 62.5e12, "bf16": 125e12}),
    ("V100", {"fp32": 15.7e12, "tf32": 15.7e12, "fp16": 125e12}),
)
#: The probe's square matrices: big enough for the BLAS to reach its speed, small enough for
#: a few tens of milliseconds per worker.
PROBE_SIZE = 512
#: The source of a CPU's peak: the worker's own probes (at start and after training).
PROBED = "gemm probe"
PROBE_TRIALS = 3
PROBE_PRODUCTS = 4


def gpu_peak_flops(name: str, precision: str, convolutional: bool = False) -> float | None:
    """The data-sheet peak of GPU ``name`` for ``precision`` (None: a model or precision the
    table does not hold). An fp32 run computes in TF32 on the tensor cores where torch lets it:
    its matrix products when the float32 matmul precision is not "highest", and a
    ``convolutional`` model's convolutions, which cuDNN runs in TF32 by default
    (``torch.backends.cudnn.allow_tf32``): its peak is then TF32's, so that its utilisation is
    against the units that did the work."""
    tf32 = torch.get_float32_matmul_precision() != "highest" or (convolutional and torch.backends.cudnn.allow_tf32)
    if precision == "fp32" and tf32:
        precision = "tf32"
    for model, peaks in GPU_PEAKS:
        if model in name:
            return peaks.get(precision, peaks.get("bf16") if precision == "fp16" else None)
    return None


def cpu_peak_flops(precision: str, size: int = PROBE_SIZE) -> float:
    """FLOP/s of the best of a few timed products of two ``size`` x ``size`` matrices, in the
    run's precision, with the threads torch was given (the run's threads per worker)."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    generator = torch.Generator().manual_seed(0)  # the run's random streams stay untouched
    a = torch.rand(size, size, generator=generator).to(dtype)
    b = torch.rand(size, size, generator=generator).to(dtype)
    torch.mm(a, b)  # warm-up: the BLAS's buffers and threads
    best = float("inf")
    for _ in range(PROBE_TRIALS):
        begin = time.perf_counter()
        for _ in range(PROBE_PRODUCTS):
            torch.mm(a, b)
        best = min(best, time.perf_counter() - begin)
    return 2 * size ** 3 * PROBE_PRODUCTS / best


def peak_rss_bytes() -> int:
    """The process's peak resident memory (``ru_maxrss``: kilobytes on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def current_rss_bytes() -> int | None:
    """The process's resident memory now (``/proc/self/statm``'s resident pages); None where
    there is no /proc (macOS)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def _cpu_seconds() -> float:
    """The CPU seconds this process has used, in user and kernel mode, over all its threads."""
    times = os.times()
    return times.user + times.system


class IntervalSampler:
    """A worker's ``sys/`` events of one logging interval (docs/system-metrics.md): its resident
    memory at the interval's end, the CPU it used over the interval in percent of one core (all
    its threads: above 100 with several), and on a GPU the memory torch has allocated there."""

    def __init__(self, device: torch.device):
        self.device = device
        self._cpu, self._wall = _cpu_seconds(), time.monotonic()

    def sample(self) -> dict[str, float]:
        """The interval's values by event name; the next interval starts now."""
        cpu, wall = _cpu_seconds(), time.monotonic()
        values: dict[str, float] = {}
        rss = current_rss_bytes()
        if rss is not None:
            values["sys/rss_bytes"] = rss
        if wall > self._wall:
            values["sys/cpu_percent"] = round(100 * (cpu - self._cpu) / (wall - self._wall), 2)
        if self.device.type == "cuda":
            values["sys/cuda_allocated_bytes"] = torch.cuda.memory_allocated(self.device)
        self._cpu, self._wall = cpu, wall
        return values


@dataclass
class DevicePeak:
    """The device a worker trains on and its peak FLOP/s (None: unknown), and where that came
    from; ``probes``: a CPU's probe results (FLOP/s), the peak being the best of them."""

    device: str
    peak_flops: float | None
    source: str          # "data sheet", "gemm probe" or "unknown"
    probes: tuple[float, ...] = ()

    def merged(self, again: DevicePeak) -> DevicePeak:
        """This peak and a later measurement of it (``again``): a CPU's peak is the best of its
        probes, since a probe that other processes slowed is too low (a rank once beat its own
        start probe by 14%); a data sheet's peak stays as it is."""
        if self.source != PROBED or again.source != PROBED:
            return self
        probes = self.probes + again.probes
        return DevicePeak(self.device, max(probes), PROBED, probes)

    @classmethod
    def of(cls, device: torch.device, precision: str, model: torch.nn.Module | None = None) -> DevicePeak:
        """``model``: the model trained, whose convolutions decide a GPU's fp32 peak (:func:`gpu_peak_flops`)."""
        if device.type == "cuda":
            name = torch.cuda.get_device_name(device)
            convolutional = model is not None and any(isinstance(m, torch.nn.modules.conv._ConvNd)
                                                      for m in model.modules())
            peak = gpu_peak_flops(name, precision, convolutional)
            return cls(name, peak, "data sheet" if peak is not None else "unknown")
        probed = cpu_peak_flops(precision)
        return cls("cpu", probed, PROBED, (probed,))


def system_record(device: torch.device, peak: DevicePeak, flops: tuple[int, str] | None, *,
                  steps: int, train_time: float) -> dict[str, Any]:
    """The value of one rank's ``system`` event (docs/worker-contract.md)."""
    cuda_peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return {"device": peak.device, "peak_rss_bytes": peak_rss_bytes(), "cuda_peak_bytes": cuda_peak,
            "peak_flops": peak.peak_flops, "peak_source": peak.source, "peak_probes": list(peak.probes),
            "flops_per_step": flops[0] if flops else None, "flops_method": flops[1] if flops else None,
            "steps": steps, "train_time": train_time}

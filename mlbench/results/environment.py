"""What the benchmark ran on: recorded with every run so that results stay comparable.

Besides the host, CPU, memory and library versions, the accelerator stack is recorded where
present: ``gpus`` (device names), ``cuda`` (the CUDA version PyTorch was built with), ``cudnn``
and ``nccl`` (the versions PyTorch uses on the GPU) and ``cuda_driver`` (the NVIDIA driver, from the kernel
module's ``/proc/driver/nvidia/version``, else ``nvidia-smi``). On a machine without them these
keys are null (``gpus`` is empty), so every run.json has the same keys.

The machine's load is recorded too (``load_average``: the 1, 5 and 15 minute load averages),
because a run made while other work kept the cores busy is slower for reasons that are not the
method's; :func:`machine_was_busy` says when a recorded load makes a run's figures suspect.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import statistics
import time
from pathlib import Path
from typing import Any

from mlbench.version import __version__


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


NVIDIA_PROC_VERSION = Path("/proc/driver/nvidia/version")


def cudnn_text(version: int | None) -> str | None:
    """cuDNN's integer version as its releases name it (cuDNN 9: 90100 -> 9.1.0; 8: 8902 -> 8.9.2)."""
    if version is None:
        return None
    scale = 10000 if version >= 90000 else 1000
    return f"{version // scale}.{version % scale // 100}.{version % 100}"


#: Device nodes of a GPU that PyTorch can use (NVIDIA's, ROCm's, WSL's): without any of them
#: torch.cuda.is_available() is False, and asking it would cost the CLI torch's import (seconds).
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")


def may_have_gpu() -> bool:
    """False where no GPU device node exists (then no PyTorch here can see a GPU)."""
    return any(os.path.exists(node) for node in GPU_DEVICE_NODES)


def cuda_available() -> bool:
    """torch.cuda.is_available(), without importing torch where no GPU device node exists."""
    if not may_have_gpu():
        return False
    import torch  # here: only a machine that may have a GPU pays for the import

    return torch.cuda.is_available()


def cuda_device_count() -> int:
    """The CUDA GPUs PyTorch sees here (0 without importing torch where no GPU device node exists)."""
    if not cuda_available():
        return 0
    import torch

    return torch.cuda.device_count()


def nccl_version() -> str | None:
    """The NCCL version PyTorch uses, when CUDA is available."""
    if not cuda_available():
        return None
    import torch

    try:
        version = torch.cuda.nccl.version()
    except (RuntimeError, AttributeError):  # a build without NCCL
        return None
    return ".".join(str(part) for part in version) if isinstance(version, tuple) else str(version)


def nvidia_driver_version(proc_file: Path = NVIDIA_PROC_VERSION) -> str | None:
    """The NVIDIA driver's version: the kernel module's own file, else ``nvidia-smi``, else None."""
    try:
        match = re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)?)\s", proc_file.read_text())
        if match:
            return match.group(1)
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def _torch_build() -> tuple[str, str | None]:
    """PyTorch's version and CUDA version (torch.__version__, torch.version.cuda) from its
    version.py alone, without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return "not installed", None
    version_file = importlib.util.spec_from_file_location(
        "_mlbench_torch_version", Path(spec.submodule_search_locations[0]) / "version.py")
    if version_file is None or version_file.loader is None:
        return "unknown", None
    module = importlib.util.module_from_spec(version_file)
    version_file.loader.exec_module(module)
    return str(module.__version__), getattr(module, "cuda", None)


def describe_environment() -> dict[str, Any]:
    """This machine, its PyTorch build and its accelerators. Where no GPU device node exists,
    torch is not imported (the CLI records the launching machine in seconds less)."""
    gpus: list[str] = []
    cudnn = None
    if cuda_available():  # the accelerator libraries count where a GPU uses them
        import torch  # here, not at the top: the CLI imports this module for usable_cores()

        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    torch_version, cuda = _torch_build()
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu": cpu_model(),
        "cores": usable_cores(),
        "memory_gb": _memory_gb(),
        "gpus": gpus,
        "torch": torch_version,
        "cuda": cuda,
        "cudnn": cudnn_text(cudnn),
        "nccl": nccl_version(),
        "cuda_driver": nvidia_driver_version(),
        "mlbench": __version__,
        "load_average": load_average(),
        "runnable": runnable_tasks(),
    }


def load_average() -> list[float] | None:
    """The machine's load averages over the last 1, 5 and 15 minutes (``os.getloadavg``),
    rounded to 2 decimals; None where the platform has none (Windows) or cannot tell."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def runnable_tasks(samples: int = 5, interval_s: float = 0.01) -> int | None:
    """How many tasks (threads) the kernel has runnable now: the median of a few reads of
    ``/proc/loadavg``'s fourth field (``R/T``: runnable / all scheduling entities, proc(5)), this
    reading thread included; None where there is no such file. Unlike the load averages, which
    decay over a minute and so still count a run that ended seconds ago (the previous run of a
    ``--repeat`` sweep), it says what runs beside a run now."""
    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg", encoding="ascii") as f:
                counts.append(int(f.read().split()[3].split("/")[0]))
        except (OSError, ValueError, IndexError):
            return None
        if i + 1 < samples:
            time.sleep(interval_s)
    return int(statistics.median(counts))


#: the share of the usable cores that others' work may keep busy before a run counts as made
#: on a busy machine (:func:`machine_was_busy`)
BUSY_SHARE = 0.5


def machine_was_busy(load: list[float] | None, cores: int | None, own_processes: int,
                     runnable: int | None = None) -> bool:
    """Whether a run was made on a busy machine: its 1-minute load average ``load[0]``, less
    the run's ``own_processes``, exceeds half of the ``cores`` the run could use.

    On Linux the load average is the number of jobs in the run queue or waiting for disk I/O,
    averaged over the last 1, 5 and 15 minutes (proc(5), ``/proc/loadavg``), a job being what
    the kernel schedules: a thread as well as a process. Why these choices:

    - The 1-minute figure, the most recent: a run is slowed by what runs beside it now, not by
      what ran a quarter of an hour ago.
    - The run's own processes are taken off whole. At the run's start they have been runnable
      for seconds only, so the one-minute average counts them in part at most, and at its end
      (after a minute of training or more) nearly whole: taking them off whole leaves the load
      of other work, or less, at both ends, so the run is never called busy because of itself.
      ``own_processes`` is what the run keeps runnable: its workers, times their threads where
      each computes on several.
    - Half of the cores: where other work keeps more than half of them busy, a run has less
      than the other half to itself, and one that uses more shares cores with that work (its
      threads wait their turn); a smaller load (a daemon, a build step, the launching CLI) is
      not flagged. A rule of thumb for calling a result suspect, not a measured bound.

    ``runnable`` (:func:`runnable_tasks`, recorded beside the load since it is), when given,
    is used instead of the load: it counts what runs at that moment, where the one-minute average
    still holds the run before (a sweep's previous run ends seconds before the next starts).

    False where the load or the cores are not known (an older run, a platform without a load
    average): nothing then says the machine was busy.
    """
    if not cores or cores < 1:
        return False
    if runnable is not None:
        return runnable - max(0, own_processes) > BUSY_SHARE * cores
    if not load:
        return False
    return load[0] - max(0, own_processes) > BUSY_SHARE * cores


def _memory_gb() -> float | None:
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        page_size = os.sysconf("SC_PAGE_SIZE")
        return round(pages * page_size / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None

"""What the benchmark ran on: recorded with every run so that results stay comparable.

Besides the host, CPU, memory and library versions, the accelerator stack is recorded where
present: ``gpus`` (device names), ``cuda`` (the CUDA version PyTorch was built with), ``cudnn``
and ``nccl`` (the versions PyTorch uses on the GPU) and ``cuda_driver`` (the NVIDIA driver, from the kernel
module's ``/proc/driver/nvidia/version``, else ``nvidia-smi``). On a machine without them these
keys are null (``gpus`` is empty), so every run.json has the same keys.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import mlbench


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


def nccl_version() -> str | None:
    """The NCCL version PyTorch uses, when CUDA is available."""
    import torch

    if not torch.cuda.is_available():
        return None
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


def describe_environment() -> dict[str, Any]:
    import torch  # here, not at the top: the CLI imports this module for usable_cores()

    gpus, cudnn = [], None
    if torch.cuda.is_available():  # the accelerator libraries count where a GPU uses them
        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu": cpu_model(),
        "cores": usable_cores(),
        "memory_gb": _memory_gb(),
        "gpus": gpus,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn_text(cudnn),
        "nccl": nccl_version(),
        "cuda_driver": nvidia_driver_version(),
        "mlbench": mlbench.__version__,
    }


def _memory_gb() -> float | None:
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        page_size = os.sysconf("SC_PAGE_SIZE")
        return round(pages * page_size / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None

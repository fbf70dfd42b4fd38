"""What the benchmark ran on: recorded with every run so that results stay comparable.

Besides the host, CPU, memory and library versions, the accelerator stack is recorded where
present: ``gpus`` (device names), ``cuda`` (the CUDA version PyTorch was built with), ``cudnn``
and ``nccl`` (the versions PyTorch uses on the GPU) and ``cuda_driver`` (the NVIDIA driver, from the kernel
module's ``/proc/driver/nvidia/version``, else ``nvidia-smi``). On a machine without them these
keys are null (``gpus`` is empty), so every run.json has the same keys.
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
    }


def _memory_gb() -> float | None:
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        page_size = os.sysconf("SC_PAGE_SIZE")
        return round(pages * page_size / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None

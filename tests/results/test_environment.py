"""What run.json records about the machine: accelerator libraries and driver where present."""

from __future__ import annotations

from pathlib import Path

import torch

from mlbench.results.environment import cudnn_text, describe_environment, nvidia_driver_version

# /proc/driver/nvidia/version as the NVIDIA kernel module writes it
PROC_VERSION = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  "
                "(dvs-builder@U16-I3-B03-4-3)  Tue Mar  5 19:15:37 UTC 2024\n"
                "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")


def test_the_environment_names_accelerator_libraries_and_driver_or_null():
    env = describe_environment()
    for key in ("gpus", "cuda", "cudnn", "nccl", "cuda_driver"):
        assert key in env, key
    if not torch.cuda.is_available():
        assert env["gpus"] == [] and env["nccl"] is None and env["cudnn"] is None
        if not Path("/proc/driver/nvidia/version").exists():
            assert env["cuda_driver"] is None
    else:
        assert env["gpus"] and all(isinstance(name, str) and name for name in env["gpus"])
        assert env["nccl"] and env["nccl"].count(".") == 2 and env["cudnn"].count(".") == 2
        assert env["cuda_driver"] and env["cuda_driver"][0].isdigit()


def test_cudnn_versions_are_written_as_releases_name_them():
    assert cudnn_text(90100) == "9.1.0"
    assert cudnn_text(8902) == "8.9.2"
    assert cudnn_text(None) is None


def test_the_driver_version_is_read_from_the_kernel_module(tmp_path, monkeypatch):
    proc = tmp_path / "version"
    proc.write_text(PROC_VERSION)
    assert nvidia_driver_version(proc) == "550.54.15"
    monkeypatch.setenv("PATH", str(tmp_path))  # and no nvidia-smi to ask
    assert nvidia_driver_version(tmp_path / "absent") is None

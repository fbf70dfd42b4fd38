"""The PyTorch references of task 1a that the JAX and the TensorFlow ports are both checked
against, each computed once per session (a ResNet-20 trained for 50 steps costs CPU-seconds the
suite's budget cannot pay twice)."""

from __future__ import annotations

import pytest
import torch

from mlbench.tasks.overrides import resolve
from mlbench.tasks.task1a import TASK1A
from tests.frameworks.in_process import train_pytorch_in_process
from tests.frameworks.resnet_reference import FLOAT64_BATCH, FLOAT64_STEPS, float32_config, pytorch_reference


def _one_torch_thread(compute):
    """One thread for PyTorch, as each worker of a run has here: CPU seconds are the suite's budget."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return compute()
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def pytorch_resnet_events(cifar_dir, shared_runs):
    """The events of the PyTorch worker's loop (``Trainer``) on :func:`float32_config`: the first
    50 training losses, the rates, the test loss and the ``system`` record of task 1a. The JAX
    and the TensorFlow modules run on different pytest-xdist workers: the first to ask computes
    it (9.5 CPU-seconds), the other reads it (tests/shared_runs.py)."""
    return shared_runs.value("pytorch-resnet20-float32-events", lambda: _one_torch_thread(
        lambda: train_pytorch_in_process(float32_config(cifar_dir))))


@pytest.fixture(scope="session")
def pytorch_float64_resnet(cifar_dir):
    """The task's settings (batch 8) and :func:`pytorch_reference` in float64 for 3 steps: the
    losses, the trained model (read it, never train it on), the initial state, the batches and
    the steps per epoch."""
    spec, _ = resolve(TASK1A, {"batch_per_worker": FLOAT64_BATCH})
    return spec, _one_torch_thread(lambda: pytorch_reference(spec, cifar_dir, FLOAT64_STEPS, dtype=torch.float64))

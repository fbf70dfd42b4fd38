"""Fixtures of the task-5a tests: real gloo process groups."""

from __future__ import annotations

import pytest
import torch

from tests.optim.support import run_on_ranks


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, and the machine is shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def on_ranks(tmp_path):
    """``on_ranks(fn, world, *args)``: ``fn(rank, world, *args)`` on real gloo processes."""
    store = tmp_path / "store"
    store.mkdir()

    def run(fn, world, *args, timeout: float = 120):
        return run_on_ranks(fn, world, *args, store_dir=str(store), timeout=timeout)
    return run

"""Fixtures of the optimizer tests (the process runner lives in support)."""

from __future__ import annotations

import pytest

from tests.optim.support import run_on_ranks


@pytest.fixture
def on_ranks(tmp_path):
    """``on_ranks(fn, world, *args)``: ``fn(rank, world, *args)`` on real gloo processes."""
    def run(fn, world, *args, timeout: float = 90):
        return run_on_ranks(fn, world, *args, store_dir=str(tmp_path), timeout=timeout)
    return run

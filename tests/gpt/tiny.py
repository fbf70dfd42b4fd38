"""The CPU-sized GPT-2 of the end-to-end task-5a tests (2 layers, width 64, context 64: open
division) and the token shards they train on, which the tests write: a repeated pattern of 257
tokens with 10% noise, so that 20 steps learn something and every run of it computes the same."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mlbench.tasks.task5a.shards import write_shard

TINY = ("--set", "layers=2", "--set", "width=64", "--set", "context=64", "--set", "global_batch=8",
        "--set", "batch_per_worker=2", "--set", "steps=20", "--set", "eval_every=10", "--set", "warmup_steps=5",
        "--set", "eval_tokens=2048", "--set", "lr=3e-3")


def write_tiny_shards(folder: Path) -> Path:
    """A validation shard of 10,000 tokens and a training shard of the rest, in ``folder``."""
    rng = np.random.default_rng(0)
    pattern = np.tile(rng.integers(0, 500, 257), 200)
    tokens = np.where(rng.random(pattern.size) < 0.1, rng.integers(0, 500, pattern.size), pattern)
    folder.mkdir(parents=True, exist_ok=True)
    write_shard(folder / "fineweb_val_000000.bin", tokens[:10_000])
    write_shard(folder / "fineweb_train_000001.bin", tokens[10_000:])
    return folder

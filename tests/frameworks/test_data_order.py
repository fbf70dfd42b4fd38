"""The data order of docs/worker-contract.md ("The data order"), written here in NumPy alone from
the document's formula, is the order the engine trains in (``epoch_batches``, which the PyTorch
worker and every port call): for tasks 1a and 2a at their data sets' sizes, several seeds,
epochs and worker counts. A worker in another framework can then draw it without torch."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from mlbench.tasks.data.identity import CIFAR10_ROWS, EPSILON_ROWS
from mlbench.tasks.data.sharding import epoch_batches, eval_shard
from mlbench.tasks.task1a import TASK1A
from mlbench.tasks.task2a import TASK2A

CONTRACT = Path(__file__).resolve().parents[2] / "docs" / "worker-contract.md"


def documented_permutation(n: int, seed: int, epoch: int) -> list[int]:
    """Steps 1-3 of the document: the epoch's seed, MT19937's outputs, the shuffle."""
    s = (1_000_003 * seed + 7_919 * epoch) % (2**63 - 1)
    u = np.random.RandomState(s % 2**32).randint(0, 2**32, size=max(n - 1, 0), dtype=np.uint32).tolist()
    p = list(range(n))
    for i in range(n - 1):
        j = i + u[i] % (n - i)
        p[i], p[j] = p[j], p[i]
    return p


def documented_batches(p: list[int], *, workers: int, rank: int, batch: int) -> np.ndarray:
    """Step 4: rank r's samples at each step t, P[(t k + r) b : (t k + r + 1) b]."""
    steps = len(p) // (workers * batch)
    return np.array([p[(t * workers + rank) * batch:(t * workers + rank + 1) * batch] for t in range(steps)],
                    np.int64).reshape(steps, batch)


def test_the_generator_is_the_c_standards_mt19937():
    """C++'s std::mt19937 default-seeded (5489) must give 4123659995 as its 10000th output
    ([rand.predef]); NumPy's RandomState seeded the same is that generator."""
    assert np.random.RandomState(5489).randint(0, 2**32, size=10_000, dtype=np.uint32)[-1] == 4123659995


@pytest.mark.parametrize("task, n", [(TASK1A, CIFAR10_ROWS["train"]), (TASK2A, EPSILON_ROWS["train"])],
                         ids=["task1a", "task2a"])
@pytest.mark.parametrize("seed, epoch", [(0, 0), (1, 3), (20260512, 7)])
def test_the_documented_order_is_the_engines(task, n, seed, epoch):
    b = task.settings.batch_per_worker
    p = documented_permutation(n, seed, epoch)
    for workers in (1, 2, 3, 8):
        for rank in sorted({0, workers // 2, workers - 1}):
            engine = epoch_batches(n, workers=workers, rank=rank, batch_per_worker=b, seed=seed, epoch=epoch)
            np.testing.assert_array_equal(engine.numpy(), documented_batches(p, workers=workers, rank=rank, batch=b),
                                          err_msg=f"{task.name} seed {seed} epoch {epoch} rank {rank}/{workers}")


@pytest.mark.parametrize("n", [1, 2, 7, 1000])
def test_small_sets_follow_the_formula_too(n):
    p = documented_permutation(n, 5, 2)
    assert sorted(p) == list(range(n))
    np.testing.assert_array_equal(epoch_batches(n, workers=2, rank=1, batch_per_worker=1, seed=5, epoch=2).numpy(),
                                  documented_batches(p, workers=2, rank=1, batch=1))


@pytest.mark.parametrize("n, workers", [(10_000, 1), (10_000, 3), (500, 8), (5, 8)])
def test_the_documented_test_shares_are_the_engines(n, workers):
    q, m = divmod(n, workers)
    for r in range(workers):
        start = r * q + min(r, m)
        assert eval_shard(n, workers=workers, rank=r) == (start, start + q + (1 if r < m else 0))


def test_the_contracts_numpy_block_is_the_engines_order():
    """The document's own NumPy code, run without torch to hand, draws the engine's order."""
    section = CONTRACT.read_text(encoding="utf-8").split("\n### The data order\n", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    assert "torch" not in code
    torch = sys.modules.pop("torch")
    sys.modules["torch"] = None   # type: ignore[assignment]   # an import of torch fails while it runs
    try:
        namespace: dict = {}
        exec(compile(code, str(CONTRACT), "exec"), namespace)
        cases = [(n, b, k, r) for n, b in ((CIFAR10_ROWS["train"], 32), (1000, 7)) for k in (1, 4)
                 for r in sorted({0, k - 1})]
        drawn = [namespace["epoch_batches"](n, workers=k, rank=r, batch_per_worker=b, seed=3, epoch=1)
                 for n, b, k, r in cases]
    finally:
        sys.modules["torch"] = torch
    for (n, b, k, r), got in zip(cases, drawn, strict=True):
        assert got.dtype == np.int64
        engine = epoch_batches(n, workers=k, rank=r, batch_per_worker=b, seed=3, epoch=1)
        np.testing.assert_array_equal(got, engine.numpy())

"""Which samples each worker sees: disjoint shards of one shared permutation per epoch.

Every worker draws the same permutation of the training set from (seed, epoch); global step s
uses samples ``perm[s*k*b : (s+1)*k*b]`` and worker r takes the r-th block of b of them. So in
every round the workers see disjoint samples (docs/tasks.md, task 1a), an epoch covers the data once
(the tail that does not fill a global batch is dropped, as torch's DistributedSampler with
drop_last does), and k workers with batch b see exactly the samples one process with batch k*b
sees: the basis of the exactness tests.
"""

from __future__ import annotations

import torch


def epoch_generator(seed: int, epoch: int, stream: int = 0) -> torch.Generator:
    """A CPU generator for one epoch and purpose (stream 0: order, 1: augmentation)."""
    gen = torch.Generator()
    gen.manual_seed((seed * 1_000_003 + epoch * 7_919 + stream) % (2**63 - 1))
    return gen


def steps_per_epoch(num_samples: int, workers: int, batch_per_worker: int) -> int:
    return num_samples // (workers * batch_per_worker)


def epoch_batches(num_samples: int, *, workers: int, rank: int, batch_per_worker: int, seed: int,
                  epoch: int) -> torch.Tensor:
    """Sample indices of this rank for every step of ``epoch``: int64 [steps, batch_per_worker]."""
    steps = steps_per_epoch(num_samples, workers, batch_per_worker)
    perm = torch.randperm(num_samples, generator=epoch_generator(seed, epoch))
    used = perm[: steps * workers * batch_per_worker]
    return used.view(steps, workers, batch_per_worker)[:, rank, :].contiguous()


def eval_shard(num_samples: int, *, workers: int, rank: int) -> tuple[int, int]:
    """[start, stop) of this rank's contiguous share of the test set (sizes differ by <= 1)."""
    base, extra = divmod(num_samples, workers)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)

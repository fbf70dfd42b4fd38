"""Which samples each worker sees, and the batched augmentation."""

import torch

from mlbench.tasks.data.augment import crop_flip, draw_augmentation
from mlbench.tasks.data.sharding import epoch_batches, eval_shard


def test_shards_are_disjoint_and_cover_the_epoch():
    n, k, b = 1000, 3, 16
    shards = [epoch_batches(n, workers=k, rank=r, batch_per_worker=b, seed=5, epoch=2) for r in range(k)]
    steps = n // (k * b)
    assert all(s.shape == (steps, b) for s in shards)
    seen = torch.cat([s.flatten() for s in shards])
    assert seen.unique().numel() == seen.numel() == steps * k * b
    assert seen.min() >= 0 and seen.max() < n


def test_k_workers_see_exactly_what_one_worker_with_batch_kb_sees():
    n, k, b = 640, 4, 8
    single = epoch_batches(n, workers=1, rank=0, batch_per_worker=k * b, seed=1, epoch=0)
    parts = [epoch_batches(n, workers=k, rank=r, batch_per_worker=b, seed=1, epoch=0) for r in range(k)]
    assert torch.equal(torch.cat(parts, dim=1), single)


def test_order_is_reshuffled_every_epoch_from_the_shared_seed():
    a0 = epoch_batches(500, workers=2, rank=0, batch_per_worker=10, seed=0, epoch=0)
    a1 = epoch_batches(500, workers=2, rank=0, batch_per_worker=10, seed=0, epoch=1)
    again = epoch_batches(500, workers=2, rank=0, batch_per_worker=10, seed=0, epoch=0)
    assert not torch.equal(a0, a1) and torch.equal(a0, again)


def test_eval_shards_partition_the_test_set():
    for n, k in [(10, 3), (500, 2), (7, 7), (3, 4)]:
        bounds = [eval_shard(n, workers=k, rank=r) for r in range(k)]
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(bounds[i][1] == bounds[i + 1][0] for i in range(k - 1))


def test_crop_flip_equals_pad_crop_and_flip_per_sample():
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (6, 3, 32, 32), generator=gen, dtype=torch.uint8)
    dy, dx, flip = draw_augmentation(6, seed=3, epoch=0)
    out = crop_flip(images, dy, dx, flip)
    for i in range(6):
        padded = torch.nn.functional.pad(images[i], (4, 4, 4, 4))
        expected = padded[:, dy[i]:dy[i] + 32, dx[i]:dx[i] + 32]
        if flip[i]:
            expected = expected.flip(-1)
        assert torch.equal(out[i], expected)


def test_augmentation_choices_cover_all_offsets_and_both_flips():
    dy, dx, flip = draw_augmentation(20000, seed=0, epoch=0)
    assert set(dy.tolist()) == set(range(9)) == set(dx.tolist())
    assert 0.48 < flip.float().mean() < 0.52

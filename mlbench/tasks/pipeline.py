"""From a task's data set to minibatches on the worker's device.

The whole data set is held as tensors (CIFAR-10 as uint8, 150 MB; epsilon as a float32 memory
map shared by all local workers through the page cache) and minibatches are gathered by index.
On a GPU the images live on the device and augmentation runs there in batch; the same code runs
on the CPU. Which data set, and its synthetic stand-in, is :mod:`mlbench.tasks.datasets`' business.
"""

from __future__ import annotations

import torch

from mlbench.tasks.data.augment import crop_flip, draw_augmentation, normalise
from mlbench.tasks.data.cifar10 import Split


def _fits_on_device(train: Split, test: Split, device: torch.device) -> bool:
    size = sum(t.numel() * t.element_size() for split in (train, test) for t in split)
    free, _ = torch.cuda.mem_get_info(device)
    return size < free / 3


class Pipeline:
    """Minibatches of one task's data on one device."""

    def __init__(self, train: Split, test: Split, device: torch.device, *, images: bool,
                 channels_last: bool = False):
        self.images = images
        self.device = device
        self.channels_last = channels_last
        # The data set moves to the GPU whole (CIFAR-10: 150 MB of uint8; epsilon: 3.2 GB of
        # float32) when it fits in a third of the free memory; otherwise only minibatches travel.
        resident = device.type == "cuda" and _fits_on_device(train, test, device)
        self.train = Split(*(t.to(device) for t in train)) if resident else train
        self.test = Split(*(t.to(device) for t in test)) if resident else test
        self._aug: tuple[torch.Tensor, ...] | None = None
        self.begin_epoch(seed=0, epoch=0)  # allocates the augmentation buffers once
        if images:
            normalise(self.train.x[:1])  # makes the normalisation constants before any capture

    @property
    def num_train(self) -> int:
        return int(self.train.y.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.test.y.shape[0])

    @property
    def num_features(self) -> int:
        return int(self.train.x.shape[1])

    def begin_epoch(self, seed: int, epoch: int) -> None:
        """Draw this epoch's augmentation for every sample (the same on every worker)."""
        if self.images:
            drawn = draw_augmentation(self.num_train, seed=seed, epoch=epoch)
            if self._aug is None:
                self._aug = tuple(t.to(self.device) for t in drawn)
            else:  # in place: a captured CUDA graph reads these very tensors
                for target, values in zip(self._aug, drawn):
                    target.copy_(values)

    def train_batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.images:
            assert self._aug is not None, "begin_epoch() draws the augmentation first"
            idx = idx.to(self.train.x.device)
            dy, dx, flip = (t.index_select(0, idx) for t in self._aug)
            x = normalise(crop_flip(self.train.x.index_select(0, idx), dy, dx, flip))
            y = self.train.y.index_select(0, idx)
            return self._images_out(x), y.to(self.device, non_blocking=True)
        return self._vectors_out(self.train, idx)

    def test_batch(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.images:
            x = normalise(self.test.x[start:stop])
            return self._images_out(x), self.test.y[start:stop].to(self.device)
        return self._vectors_out(self.test, slice(start, stop))

    def _images_out(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.device, non_blocking=True)
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

    def _vectors_out(self, split: Split, idx: torch.Tensor | slice) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(idx, torch.Tensor):
            # index_select, not x[idx]: on the CPU the advanced-indexing kernel takes 2-3 times as
            # long for the same rows (0.45 against 0.19 ms for 100 rows of epsilon, one thread)
            idx = idx.to(split.x.device)
            x, y = split.x.index_select(0, idx), split.y.index_select(0, idx)
        else:
            x, y = split.x[idx], split.y[idx]
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

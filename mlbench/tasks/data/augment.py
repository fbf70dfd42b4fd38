"""CIFAR-10 augmentation as batched tensor operations (He et al. 2015, section 4.2).

Pad 4 pixels with zeros, take a random 32x32 crop, flip horizontally with probability 1/2, scale
to [0, 1] and normalise per channel. One gather does crop and flip for a whole batch, on the CPU
or on the GPU where the data set lives (airbench's approach): no per-sample Python, no loader
processes. The random choices of an epoch are drawn for every sample index up front from the
shared seed, so a sample is augmented the same way whichever worker (and worker count) sees it.
"""

from __future__ import annotations

import torch

from mlbench.tasks.data.sharding import epoch_generator

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
PAD = 4
SIZE = 32


def draw_augmentation(num_samples: int, *, seed: int, epoch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample crop offsets (dy, dx in 0..2*PAD) and flip flags for one epoch."""
    gen = epoch_generator(seed, epoch, stream=1)
    offsets = torch.randint(0, 2 * PAD + 1, (num_samples, 2), generator=gen)
    flips = torch.randint(0, 2, (num_samples,), generator=gen).bool()
    return offsets[:, 0].contiguous(), offsets[:, 1].contiguous(), flips


_CONSTANTS: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}


def _mean_std(device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel constants, made once per device: a CUDA graph may not copy from the host."""
    key = (device, dtype)
    if key not in _CONSTANTS:
        _CONSTANTS[key] = (torch.tensor(CIFAR10_MEAN, dtype=dtype).view(1, 3, 1, 1).to(device),
                           torch.tensor(CIFAR10_STD, dtype=dtype).view(1, 3, 1, 1).to(device))
    return _CONSTANTS[key]


def normalise(images: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 [B,3,H,W] -> normalised float [B,3,H,W]."""
    mean, std = _mean_std(images.device, dtype)
    return (images.to(dtype) / 255.0 - mean) / std


def crop_flip(images: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    """Random-crop-with-padding and horizontal flip of a uint8 batch [B,3,32,32], as one gather.

    Output pixel (i, j) of sample n is padded pixel (dy[n] + i, dx[n] + j), or
    (dy[n] + i, dx[n] + 31 - j) when flipped: exactly torchvision's RandomCrop(32, padding=4)
    followed by RandomHorizontalFlip for the same random choices.
    """
    batch = images.shape[0]
    device = images.device
    padded = torch.nn.functional.pad(images, (PAD, PAD, PAD, PAD))
    ar = torch.arange(SIZE, device=device)
    rows = dy.to(device).view(batch, 1) + ar.view(1, SIZE)
    cols_fwd = ar.view(1, SIZE)
    cols = torch.where(flip.to(device).view(batch, 1), SIZE - 1 - cols_fwd, cols_fwd) + dx.to(device).view(batch, 1)
    n_idx = torch.arange(batch, device=device).view(batch, 1, 1, 1)
    c_idx = torch.arange(images.shape[1], device=device).view(1, -1, 1, 1)
    return padded[n_idx, c_idx, rows.view(batch, 1, SIZE, 1), cols.view(batch, 1, 1, SIZE)]

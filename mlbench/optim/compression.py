"""Pieces shared by the compressing optimizers: local momentum, sign bits, per-tensor segments.

signSGD and sparsified SGD compress a vector per worker, so momentum and weight decay have to be
applied on each worker before compression (the "Signum" order of Bernstein et al. 2018, and the
momentum-before-memory order of Karimireddy et al. 2019): that is :class:`LocalMomentum`. A sign
travels as one bit: :func:`pack_signs` packs eight coordinates per byte, the encoding that makes
signSGD's message 32 times smaller than fp32.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_BIT_VALUES = (1, 2, 4, 8, 16, 32, 64, 128)


class LocalMomentum:
    """``m <- momentum * m + (g + weight_decay * x)`` on flat vectors (torch's heavy-ball form;
    no Nesterov correction); returns ``m`` (or the decayed gradient when momentum is 0)."""

    def __init__(self, momentum: float, weight_decay: float):
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.buffer: torch.Tensor | None = None

    def __call__(self, grad: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        if self.weight_decay:
            grad = grad.add(params, alpha=self.weight_decay)
        if not self.momentum:
            return grad
        if self.buffer is None:
            self.buffer = grad.clone()
        else:
            self.buffer.mul_(self.momentum).add_(grad)
        return self.buffer


def signs(x: torch.Tensor) -> torch.Tensor:
    """+1 where x >= 0, else -1 (zero counts as positive: a bit has two values)."""
    return torch.where(x >= 0, 1.0, -1.0).to(x.dtype)


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    """One bit per coordinate of ``x`` (1: x >= 0), eight per uint8, zero-padded at the end."""
    n = x.numel()
    bits = torch.zeros(-(-n // 8) * 8, dtype=torch.uint8, device=x.device)
    bits[:n] = (x.reshape(-1) >= 0).to(torch.uint8)
    weights = torch.tensor(_BIT_VALUES, dtype=torch.uint8, device=x.device)
    return (bits.view(-1, 8) * weights).sum(dim=1, dtype=torch.uint8)


def count_positive(packed: list[torch.Tensor], n: int) -> torch.Tensor:
    """For each of the first ``n`` coordinates, how many of the packed vectors have its bit set."""
    stacked = torch.stack(packed)                                  # [k, bytes]
    weights = torch.tensor(_BIT_VALUES, dtype=torch.uint8, device=stacked.device)
    bits = (stacked.unsqueeze(-1) & weights) != 0                  # [k, bytes, 8]
    return bits.sum(dim=0, dtype=torch.int32).reshape(-1)[:n]


def unpack_signs(packed: torch.Tensor, n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The +1/-1 vector that :func:`pack_signs` encoded."""
    return count_positive([packed], n).to(dtype) * 2 - 1


class Segments:
    """The flat layout of a list of tensors: per-tensor sums and broadcasts on flat vectors."""

    def __init__(self, tensors: Sequence[torch.Tensor]):
        sizes = torch.tensor([t.numel() for t in tensors])
        device = tensors[0].device if tensors else torch.device("cpu")
        self.sizes = sizes.to(device)
        self.ids = torch.repeat_interleave(torch.arange(len(tensors)), sizes).to(device)

    def mean_abs(self, flat: torch.Tensor) -> torch.Tensor:
        """||x_t||_1 / d_t for each tensor t."""
        totals = torch.zeros(len(self.sizes), dtype=flat.dtype, device=flat.device)
        return totals.index_add_(0, self.ids, flat.abs()) / self.sizes

    def expand(self, per_tensor: torch.Tensor) -> torch.Tensor:
        """A flat vector holding each tensor's value at each of its coordinates."""
        return per_tensor[self.ids]

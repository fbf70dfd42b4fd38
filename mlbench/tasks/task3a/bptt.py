"""How task 3a's token stream becomes batches: the batchified matrix, each worker's columns, and
AWD-LSTM's random back-propagation-through-time (BPTT) lengths.

* :func:`batchify` cuts the stream of N tokens into B contiguous segments, one per column of an
  [N // B, B] matrix (the tail is dropped), as the AWD-LSTM reference code does.
* With k workers of b columns each the matrix has B = k*b columns and worker r trains on
  columns [r*b, (r+1)*b) (the original MLBench's ``generate_batches``). One process with k*b
  columns therefore sees exactly the tokens the k workers see together, in the same places:
  the basis of the k-workers exactness test.
* :func:`bptt_lengths`: each batch is ``seq_len`` consecutive rows; ``seq_len`` is drawn as in
  Merity et al. 2018 (Sec. 4.1): the base length is ``bptt`` with probability 0.95, else
  ``bptt / 2``; then ``seq_len = max(5, int(Normal(base, 5)))``, cut at the end of the matrix.
  The draws come from a generator seeded by (seed, epoch) that every rank builds alike, so all
  ranks use the same lengths without a collective.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

#: Standard deviation and minimum of the random sequence length (Merity et al. 2018, Sec. 4.1).
LENGTH_STD = 5.0
MIN_LENGTH = 5
FULL_LENGTH_PROBABILITY = 0.95


def batchify(stream: np.ndarray | torch.Tensor, columns: int) -> torch.Tensor:
    """int64 [len(stream) // columns, columns]; column j is the j-th contiguous segment."""
    data = torch.from_numpy(np.array(stream, dtype=np.int64))
    rows = data.numel() // columns
    if rows < 2:
        raise ValueError(f"{data.numel()} tokens do not fill two rows of {columns} columns")
    return data[: rows * columns].view(columns, rows).t().contiguous()


def worker_columns(matrix: torch.Tensor, rank: int, per_worker: int) -> torch.Tensor:
    """Worker ``rank``'s ``per_worker`` columns of the batchified matrix."""
    return matrix[:, rank * per_worker:(rank + 1) * per_worker].contiguous()


def bptt_lengths(rows: int, bptt: int, seed: int, epoch: int) -> list[int]:
    """Random sequence lengths of one training epoch over a matrix of ``rows`` rows (the
    reference's loop: a batch starts at row i while i < rows - 2 and reads rows i..i+len-1,
    targets i+1..i+len)."""
    gen = np.random.default_rng([seed, epoch])
    lengths = []
    i = 0
    while i < rows - 2:
        base = bptt if gen.random() < FULL_LENGTH_PROBABILITY else bptt / 2
        length = min(max(MIN_LENGTH, int(gen.normal(base, LENGTH_STD))), rows - 1 - i)
        lengths.append(length)
        i += length
    return lengths


def eval_lengths(rows: int, bptt: int) -> list[int]:
    """Fixed lengths covering every row once (the reference's ``evaluate``)."""
    return [min(bptt, rows - 1 - i) for i in range(0, rows - 1, bptt)]


def bptt_batches(matrix: torch.Tensor, lengths: list[int]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(inputs [len, B], targets [len * B]) for consecutive sequence lengths."""
    i = 0
    for length in lengths:
        yield matrix[i:i + length], matrix[i + 1:i + 1 + length].reshape(-1)
        i += length

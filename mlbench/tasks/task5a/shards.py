"""Token shards: the file format of llm.c and the modded-nanogpt speedrun, and the token stream.

A shard is a header of 256 little-endian int32 (``[0]`` the magic 20240520, ``[1]`` the version 1,
``[2]`` the number of tokens), then that many uint16 GPT-2 token ids (llm.c's
``dev/data/data_common.py`` writes it; modded-nanogpt's ``_load_data_shard`` reads it). FineWeb's
10B-token sample comes as ``fineweb_train_000001.bin`` ... ``fineweb_train_000103.bin`` (100M
tokens each, the last fewer) and ``fineweb_val_000000.bin``.

Training reads the train shards in name order as one stream. Global step ``s`` takes the
``global_batch`` sequences that start at token ``s * global_batch * context``; sequence ``j`` is
``context + 1`` tokens from ``j * context`` on (inputs and targets shifted by one, as llm.c's
loader). The stream wraps around at its end. A worker takes its sequences of each step by
:func:`worker_sequences`, so that k workers together see exactly one process's global batch.
Torch-free but for the tensors it hands out.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

import numpy as np

from mlbench.errors import UsageError

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
TRAIN_PATTERN = "fineweb_train_*.bin"
VAL_PATTERN = "fineweb_val_*.bin"


class ShardError(UsageError):
    """A shard that is not in the format (one line naming the file and what is wrong)."""


def write_shard(path: pathlib.Path, tokens: Sequence[int] | np.ndarray) -> None:
    """Write ``tokens`` (ids below 65,536) as a shard at ``path`` (tests and own text use it)."""
    ids = np.asarray(tokens)
    if ids.size and (ids.min() < 0 or ids.max() >= 1 << 16):
        raise ShardError(f"{path}: token ids must lie in 0..65535 to be stored as uint16")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = (MAGIC, VERSION, ids.size)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    with open(part, "wb") as f:
        f.write(header.tobytes())
        f.write(ids.astype("<u2").tobytes())
    part.replace(path)


def read_header(path: pathlib.Path) -> int:
    """The token count of the shard at ``path``, after checking its header and its size."""
    try:
        with open(path, "rb") as f:
            raw = f.read(HEADER_BYTES)
    except OSError as exc:
        raise ShardError(f"cannot read the shard {path}: {exc.strerror or exc}") from None
    if len(raw) < HEADER_BYTES:
        raise ShardError(f"{path} is not a token shard: {len(raw)} bytes, shorter than the 1,024-byte header")
    header = np.frombuffer(raw, dtype="<i4")
    if header[0] != MAGIC:
        raise ShardError(f"{path} is not a token shard: magic {int(header[0])}, expected {MAGIC}")
    if header[1] != VERSION:
        raise ShardError(f"{path}: shard version {int(header[1])}, expected {VERSION}")
    count = int(header[2])
    size = path.stat().st_size
    if size != HEADER_BYTES + 2 * count:
        raise ShardError(f"{path}: the header counts {count:,} tokens ({HEADER_BYTES + 2 * count:,} bytes) "
                         f"but the file has {size:,} bytes (an interrupted copy?)")
    return count


def load_tokens(path: pathlib.Path) -> np.ndarray:
    """The shard's tokens as a read-only uint16 memory map (checked by :func:`read_header`)."""
    count = read_header(path)
    if count == 0:
        return np.zeros(0, dtype=np.uint16)
    return np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES, shape=(count,))


def find_shards(folder: pathlib.Path, pattern: str) -> list[pathlib.Path]:
    """The shards in ``folder`` that match ``pattern``, in name order."""
    return sorted(p for p in folder.glob(pattern) if p.is_file())


class TokenStream:
    """The concatenation of shards as one sequence of tokens, read by offset (wrapping at its end)."""

    def __init__(self, paths: Sequence[pathlib.Path]):
        self.paths = list(paths)
        self.parts = [load_tokens(p) for p in self.paths]
        self.starts = np.cumsum([0] + [len(t) for t in self.parts])
        self.total = int(self.starts[-1])

    def read(self, offset: int, count: int) -> np.ndarray:
        """``count`` tokens from ``offset`` on (modulo the stream's length), as int64."""
        if self.total == 0:
            raise ShardError(f"the shards {', '.join(str(p) for p in self.paths)} hold no tokens")
        out = np.empty(count, dtype=np.int64)
        filled, at = 0, offset % self.total
        while filled < count:
            shard = int(np.searchsorted(self.starts, at, side="right")) - 1
            begin = at - int(self.starts[shard])
            take = min(count - filled, len(self.parts[shard]) - begin)
            out[filled:filled + take] = self.parts[shard][begin:begin + take]
            filled += take
            at = (at + take) % self.total
        return out


def worker_sequences(step_micro: int, rank: int, workers: int, micro_batch: int) -> range:
    """The indices (within the global batch) of the sequences of micro-batch ``step_micro`` of
    ``rank``: micro-batch m of all ranks together is the global batch's m-th slice of
    ``workers * micro_batch`` sequences, rank r taking its r-th part of it."""
    first = (step_micro * workers + rank) * micro_batch
    return range(first, first + micro_batch)

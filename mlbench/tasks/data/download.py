"""Where data sets live on disk, how they get there, and the form the loaders hand them out in.

Every worker process of a run loads its data set itself, so K processes that start together on a
fresh machine would all find the data missing at once. The first download (and the first LIBSVM
conversion) therefore happens under an exclusive file lock: one process does the work, the others
wait and then find it done. Downloads land under a temporary name and are renamed into place, so a
file that exists under its final name is always complete.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import tarfile
from collections.abc import Iterator
from typing import NamedTuple

import torch
from torchvision.datasets.utils import download_url

#: Exceptions a download or extraction can end with when the network, the server or the disk
#: fails (urllib's errors are OSErrors; torchvision raises RuntimeError for a wrong md5).
DOWNLOAD_ERRORS = (OSError, RuntimeError, RecursionError, EOFError, tarfile.TarError)


class Split(NamedTuple):
    """One part (train or test) of a data set, whole, as tensors.

    CIFAR-10: x uint8 [N, 3, 32, 32] (C, H, W; RGB), y int64 [N] in 0..9.
    LIBSVM: x float32 [N, d] (sharing the binary cache's memory map), y float32 [N] in {-1, +1}.
    """

    x: torch.Tensor
    y: torch.Tensor


def default_data_root() -> pathlib.Path:
    """$MLBENCH_DATA if set, else ~/.cache/mlbench/data: one place, outside the run store, so that
    data sets are downloaded and converted once per machine, not once per run."""
    env = os.environ.get("MLBENCH_DATA")
    return pathlib.Path(env).expanduser() if env else pathlib.Path.home() / ".cache" / "mlbench" / "data"


@contextlib.contextmanager
def exclusive(lock_path: pathlib.Path) -> Iterator[None]:
    """Hold an exclusive lock on `lock_path` (created if needed) for the duration of the block.

    flock is released by the kernel when the holder dies, so a crashed download never leaves a
    lock behind that would block the next run (fcntl: Linux and macOS, where workers run).
    """
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


MIRROR_ENV = "MLBENCH_DATA_MIRROR"


def source_url(url: str) -> str:
    """Where to download ``url`` from: itself, or the file of the same name under
    $MLBENCH_DATA_MIRROR (an http(s) URL, e.g. a local mirror of the official files for machines
    or clusters without internet; checksums still apply)."""
    mirror = os.environ.get(MIRROR_ENV)
    return f"{mirror.rstrip('/')}/{url.rsplit('/', 1)[1]}" if mirror else url


def fetch(url: str, dest: pathlib.Path, md5: str | None = None) -> None:
    """Download `url` to `dest` unless `dest` exists; an interrupted download leaves only a
    `.part` file, never a truncated file under the final name. With `md5`, a download with
    another checksum fails (RuntimeError) and is removed."""
    if dest.is_file():
        return
    part = dest.with_name(dest.name + ".part")
    part.unlink(missing_ok=True)
    try:
        download_url(url, str(dest.parent), filename=part.name, md5=md5)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    os.replace(part, dest)


def one_line(exc: BaseException) -> str:
    """The reason an operation failed, as a single line fit for the middle of an error sentence."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text.rstrip(".")

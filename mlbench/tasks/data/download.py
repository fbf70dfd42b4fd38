"""Where data sets live on disk, how they get there, and the form the loaders hand them out in.

Every worker process of a run loads its data set itself, so K processes that start together on a
fresh machine would all find the data missing at once. The first download (and the first LIBSVM
conversion) therefore happens under an exclusive file lock: one process does the work, the others
wait and then find it done. Downloads land under a temporary name and are renamed into place, so a
file that exists under its final name is always complete. Data sets are large (CIFAR-10 170 MB,
epsilon 12 GB), so a download shows its progress (:mod:`mlbench.progress`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import os
import pathlib
import tarfile
import urllib.request
from collections.abc import Iterator
from typing import NamedTuple

import torch

from mlbench.version import __version__
from mlbench.progress import Progress
# default_data_root and one_line live in the torch-free paths module (the data's identity reads
# them too); the loaders take them from here
from mlbench.tasks.data.paths import default_data_root as default_data_root
from mlbench.tasks.data.paths import one_line as one_line

#: Exceptions a download or extraction can end with when the network, the server or the disk
#: fails (urllib's errors are OSErrors, a connection cut mid-body an HTTPException; a wrong md5
#: is a RuntimeError).
DOWNLOAD_ERRORS = (OSError, RuntimeError, RecursionError, EOFError, tarfile.TarError,
                   http.client.HTTPException)
#: Bytes read from the network at a time, and seconds a silent connection is given.
CHUNK_BYTES = 1 << 16
TIMEOUT_S = 60


class Split(NamedTuple):
    """One part (train or test) of a data set, whole, as tensors.

    CIFAR-10: x uint8 [N, 3, 32, 32] (C, H, W; RGB), y int64 [N] in 0..9.
    LIBSVM: x float32 [N, d] (sharing the binary cache's memory map), y float32 [N] in {-1, +1}.
    """

    x: torch.Tensor
    y: torch.Tensor


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


def fetch(url: str, dest: pathlib.Path, md5: str | None = None, label: str | None = None) -> None:
    """Download `url` to `dest` unless `dest` exists, showing progress as "Downloading LABEL".

    The bytes go to `dest`.part (created anew, never through a link planted there) and are
    renamed into place only when complete and, given `md5`, checked, so a file under the final
    name is always whole; a failed download removes its part file.
    """
    if dest.is_file():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    part.unlink(missing_ok=True)
    digest = hashlib.md5(usedforsecurity=False)
    request = urllib.request.Request(url, headers={"User-Agent": f"mlbench/{__version__}"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response, open(part, "xb") as out, \
                Progress(f"Downloading {label or dest.name}", total=response.length) as progress:
            while chunk := response.read(CHUNK_BYTES):
                out.write(chunk)
                digest.update(chunk)
                progress.advance(len(chunk))
        if md5 is not None and digest.hexdigest() != md5:
            raise RuntimeError(f"the download of {url} is damaged (md5 {digest.hexdigest()}, "
                               f"expected {md5})")
        os.replace(part, dest)
    except BaseException:
        part.unlink(missing_ok=True)
        raise

"""CIFAR-10 in its official python layout (`cifar-10-batches-py/`), as whole uint8 tensors.

The official python version is read directly rather than through torchvision's CIFAR10 dataset:
torchvision insists on the official md5 of every extracted file, which rejects faithful rebuilds
of the data (such as the one made from ../shared/data for tests), and it yields PIL images one at
a time, while the workers want the whole set as one tensor to shard, augment and move to a device
in bulk. Only the downloaded archive's md5 is checked; the extracted batches are checked for the
keys, shapes and label range the official files have.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import tarfile
import tempfile

import numpy as np
import torch

from mlbench.errors import DataError
from mlbench.tasks.data.download import (
    DOWNLOAD_ERRORS,
    Split,
    default_data_root,
    exclusive,
    fetch,
    one_line,
    source_url,
)
from mlbench.tasks.data.cifar10_layout import (
    FOLDER,
    TEST_FILE,
    TRAIN_FILES,
    batches_folder,
    default_root,
    load_batch,
    missing,
)

__all__ = ["FOLDER", "MD5", "URL", "Split", "default_data_root", "load_cifar10"]

URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
MD5 = "c58f30108f718f92721af3b95e74349a"
_ROW = 3 * 32 * 32

def load_cifar10(data_dir: str | os.PathLike | None = None, download: bool = True) -> tuple[Split, Split]:
    """The official train (50,000) and test (10,000) splits as (train, test).

    `data_dir` may be the `cifar-10-batches-py` folder itself or a folder holding it; nothing is
    downloaded into a folder the user named. With `data_dir` None the data lives in
    default_data_root()/cifar10 and is downloaded there on first use when `download` is true.
    """
    if data_dir is not None:
        folder = _batches_folder(pathlib.Path(data_dir).expanduser())
    else:
        root = default_root()
        folder = root / FOLDER
        if missing(folder):
            if not download:
                raise DataError(
                    f"CIFAR-10 is not in {root}; put the official python version ({FOLDER}/) there, "
                    "pass --data-dir DIR, or allow the download"
                )
            _download(root)
    train = [_read_batch(folder / name) for name in TRAIN_FILES]
    test = _read_batch(folder / TEST_FILE)
    # joined by NumPy, not torch.cat: a parallel torch operation starts torch's OpenMP pool, after
    # which the process that checked the data (the run's supervisor) may no longer fork its ranks
    # (mlbench.launch.forked.forking_allowed) and starts fresh interpreters instead
    return Split(torch.from_numpy(np.concatenate([s.x.numpy() for s in train])),
                 torch.from_numpy(np.concatenate([s.y.numpy() for s in train]))), test


def _batches_folder(data_dir: pathlib.Path) -> pathlib.Path:
    """The folder holding the batch files, given either it or its parent."""
    if not data_dir.is_dir():
        raise DataError(f"the data folder {data_dir} does not exist; pass the folder that holds {FOLDER}/")
    folder = batches_folder(data_dir)
    lacking = missing(folder)
    if lacking:
        raise DataError(
            f"CIFAR-10 in {folder} lacks {', '.join(lacking)}; put the complete official python version "
            f"({FOLDER}/ with {', '.join(TRAIN_FILES)} and {TEST_FILE}) there"
        )
    return folder


def _download(root: pathlib.Path) -> None:
    """Download and extract the official archive into root/cifar-10-batches-py.

    Extraction goes to a temporary folder that is renamed into place, so an interrupted
    extraction never looks like a complete data set; the archive is deleted once extracted.
    """
    with exclusive(root / ".lock"):
        if not missing(root / FOLDER):
            return  # another worker finished it while this one waited for the lock
        staging = pathlib.Path(tempfile.mkdtemp(prefix=".extract-", dir=root))
        archive = root / URL.rsplit("/", 1)[1]
        try:
            fetch(source_url(URL), archive, md5=MD5, label="CIFAR-10")
            with tarfile.open(archive) as tar:
                # "data": no absolute paths, links out of the folder or special files (PEP 706)
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(staging, filter="data")
                else:
                    tar.extractall(staging)
            archive.unlink()
            if missing(staging / FOLDER):
                raise RuntimeError(f"the archive has no complete {FOLDER}/ folder")
            shutil.rmtree(root / FOLDER, ignore_errors=True)
            os.replace(staging / FOLDER, root / FOLDER)
        except DOWNLOAD_ERRORS as exc:
            raise DataError(
                f"could not download CIFAR-10 ({one_line(exc)}); put the official python version "
                f"({FOLDER}/) in {root} or pass --data-dir DIR"
            ) from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _read_batch(path: pathlib.Path) -> Split:
    """One batch file as (uint8 [n, 3, 32, 32], int64 [n]); row layout: c*1024 + h*32 + w."""
    entry = load_batch(path)
    data = entry.get("data") if isinstance(entry, dict) else None
    labels = np.asarray(entry.get("labels", []) if isinstance(entry, dict) else [])
    problem = None
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != _ROW:
        problem = f"'data' is not a uint8 array of rows of {_ROW} values"
    elif labels.shape != (len(data),) or not np.issubdtype(labels.dtype, np.integer):
        problem = f"'labels' does not hold one integer per row of 'data' ({len(data)})"
    elif len(labels) and (labels.min() < 0 or labels.max() > 9):
        problem = "'labels' has values outside 0..9"
    if problem:
        raise DataError(
            f"{path} is not a CIFAR-10 batch ({problem}); replace it with the file from the official python version"
        )
    x = torch.from_numpy(np.require(data, requirements=["C", "W"]).reshape(-1, 3, 32, 32))
    return Split(x, torch.from_numpy(labels.astype(np.int64)))

"""CIFAR-10's official python layout as mlbench reads it: torch-free.

The folder and file names, the only pickle globals a batch may refer to, and the unpickler that
refuses every other one. The loader (:mod:`mlbench.tasks.data.cifar10`, which imports torch) and
the data's identity (:mod:`mlbench.tasks.data.identity`, which must not) both read a batch
through here, so that they find the same files and trust the same pickles.
"""

from __future__ import annotations

import pathlib
import pickle
from typing import Any

from mlbench.errors import DataError
from mlbench.tasks.data.paths import default_data_root, one_line

__all__ = ["ALLOWED_GLOBALS", "FILES", "FOLDER", "TEST_FILE", "TRAIN_FILES", "BatchUnpickler", "batches_folder",
           "default_root", "load_batch", "missing", "unreadable"]

FOLDER = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
FILES = (*TRAIN_FILES, TEST_FILE)

# The only globals an official batch (or a rebuild with numpy 1 or 2, any pickle protocol)
# refers to. A batch file is a pickle from wherever the user got it; refusing every other global
# keeps a tampered file from running code when it is loaded.
ALLOWED_GLOBALS = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("_codecs", "encode"),
}


class BatchUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"it refers to {module}.{name}, which a CIFAR-10 batch never does")
        return super().find_class(module, name)


def default_root() -> pathlib.Path:
    """Where CIFAR-10 is downloaded to and read from without ``--data-dir``: this folder's
    ``cifar-10-batches-py``."""
    return default_data_root() / "cifar10"


def batches_folder(base: pathlib.Path) -> pathlib.Path:
    """The folder of the batch files when the user named ``base``: its ``cifar-10-batches-py``
    if it has one, else ``base`` itself."""
    return base / FOLDER if (base / FOLDER).is_dir() else base


def missing(folder: pathlib.Path) -> list[str]:
    """The batch files ``folder`` lacks, in their order."""
    return [name for name in FILES if not (folder / name).is_file()]


def load_batch(path: pathlib.Path) -> Any:
    """The unpickled content of one batch file; a DataError of one line when it is no pickle a
    CIFAR-10 batch could be (its content is the caller's to check)."""
    try:
        with open(path, "rb") as handle:
            # latin1 turns the official files' Python 2 strings into str keys and byte buffers.
            return BatchUnpickler(handle, encoding="latin1").load()
    except Exception as exc:  # a corrupt pickle can fail with almost any exception type
        raise unreadable(path, exc) from None


def unreadable(path: pathlib.Path, exc: BaseException) -> DataError:
    """The error for a batch file that cannot be read as one, ``exc`` saying why."""
    return DataError(f"{path} is not a readable CIFAR-10 batch ({one_line(exc)}); replace it with the file "
                     "from the official python version")

"""The data sets of the tasks, by name.

A task spec names its data set (``TaskSpec.dataset``); :data:`DATASETS` maps the name to a
:class:`Dataset` registered with :func:`register_dataset`. Every data set can be *prepared*
(downloaded, converted and checked once, before any worker starts, so that a missing data set is
one line and the download happens once). The classification data sets also load as (train, test)
tensors, have a synthetic stand-in of the same shape (``--data synthetic``, for throughput only)
and say whether the samples are uint8 images (which get the batched crop/flip augmentation and
per-channel normalisation of :mod:`mlbench.tasks.data.augment`); the language data sets are read
by their tasks' runtimes.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from mlbench.errors import UsageError
from mlbench.tasks.data.cifar10 import Split

#: Input width of epsilon (docs/tasks.md, task 2a).
EPSILON_FEATURES = 2000


@dataclass(frozen=True)
class Dataset:
    name: str
    prepare: Callable[[str | None], object]
    images: bool = False
    load: Callable[[str | None], tuple[Split, Split]] | None = None
    synthetic: Callable[[int], tuple[Split, Split]] | None = None


DATASETS: dict[str, Dataset] = {}


def register_dataset(dataset: Dataset) -> Dataset:
    DATASETS[dataset.name] = dataset
    return dataset


def get_dataset(name: str) -> Dataset:
    try:
        return DATASETS[name]
    except KeyError:
        raise UsageError(f"unknown data set {name!r}") from None


#: Synthetic splits made in this process, by (data set, seed): the local supervisor makes them
#: once before it forks its ranks (:func:`make_synthetic_before_fork`), and every rank then reads
#: the same pages copy-on-write instead of drawing 320 MB (epsilon) of its own.
_SYNTHETIC_MADE: dict[tuple[str, int], tuple[Split, Split]] = {}


def load_splits(dataset: str, source: str, data_dir: str | None, seed: int = 0) -> tuple[Split, Split]:
    """(train, test) for a task's data set: the real one, or random data of its shape."""
    entry = get_dataset(dataset)
    loader = entry.synthetic if source == "synthetic" else entry.load
    if loader is None:
        raise UsageError(f"the data set {dataset!r} is read by its task's runtime, not as tensors")
    if source != "synthetic":
        return loader(data_dir)  # type: ignore[arg-type]
    made = _SYNTHETIC_MADE.get((dataset, seed))
    if made is None:
        made = _SYNTHETIC_MADE[(dataset, seed)] = loader(seed)  # type: ignore[arg-type]
    return made


def make_synthetic_before_fork(dataset: str, seed: int) -> None:
    """Draw ``dataset``'s synthetic splits in this process, for the ranks it is about to fork.

    Safe before a fork because the draw is NumPy's (one thread; torch's OpenMP pool, which a
    forked child cannot use, stays unstarted) and the tensors only wrap NumPy's arrays."""
    load_splits(dataset, "synthetic", None, seed)


def synthetic_splits(dataset: str, seed: int = 0) -> tuple[Split, Split]:
    """Random (train, test) data of ``dataset``'s shape (``--data synthetic``)."""
    return load_splits(dataset, "synthetic", None, seed)


def _load_cifar10(data_dir: str | None) -> tuple[Split, Split]:
    from mlbench.tasks.data.cifar10 import load_cifar10

    return load_cifar10(data_dir)


#: Synthetic data measure throughput only (their accuracy means nothing), so their test set is
#: small: the evaluation that ends a run costs a tenth of the real data set's.
SYNTHETIC_TEST_SAMPLES = 1_000
#: The synthetic epsilon's training set: 40,000 rows of 2,000 features (320 MB), a tenth of the
#: real one's, so that its gathers run from main memory as the real set's do.
SYNTHETIC_EPSILON_TRAIN = 40_000


def _synthetic_cifar10(seed: int) -> tuple[Split, Split]:
    gen = np.random.default_rng(seed)
    return tuple(Split(torch.from_numpy(gen.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)),  # type: ignore[return-value]
                       torch.from_numpy(gen.integers(0, 10, n, dtype=np.int64)))
                 for n in (50_000, SYNTHETIC_TEST_SAMPLES))


def _load_epsilon(data_dir: str | None) -> tuple[Split, Split]:
    from mlbench.tasks.data.libsvm import load_libsvm_dataset

    return load_libsvm_dataset(data_dir, name="epsilon")


def _synthetic_epsilon(seed: int) -> tuple[Split, Split]:
    """Normal features scaled to unit-norm rows on average, as epsilon's, and labels -1/+1.

    Drawn by torch on one thread: 80 million normal floats take NumPy's generator 1.9 CPU-seconds
    on a 2-core box and torch's 0.5, paid by every worker that starts as a fresh interpreter (a
    Slurm task, a pod, torchrun's). One thread, so that a supervisor drawing them for its ranks
    before it forks them starts no OpenMP pool (mlbench.launch.forked.may_fork); the count of
    threads is given back after."""
    generator = torch.Generator().manual_seed(seed)

    def split(n: int) -> Split:
        x = torch.randn((n, EPSILON_FEATURES), generator=generator)
        x *= EPSILON_FEATURES ** -0.5
        return Split(x, torch.randint(0, 2, (n,), generator=generator).to(torch.float32) * 2 - 1)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return split(SYNTHETIC_EPSILON_TRAIN), split(SYNTHETIC_TEST_SAMPLES)
    finally:
        torch.set_num_threads(threads)


def _prepare_wikitext2(data_dir: str | None) -> object:
    from mlbench.tasks.task3a.wikitext import load_wikitext2

    return load_wikitext2(data_dir)


def _prepare_wmt17(data_dir: str | None) -> object:
    from mlbench.tasks.task4b.bpe import encode_wmt17
    from mlbench.tasks.task4b.wmt import wmt17_folder
    from mlbench.tasks.task4b.settings import TranslationSettings

    return encode_wmt17(wmt17_folder(data_dir), TranslationSettings().vocab_size)


def _prepare_fineweb(data_dir: str | None) -> object:
    """FineWeb's shards: downloaded (all of them) into the data root unless ``--data-dir`` has them."""
    from mlbench.tasks.task5a import fineweb
    from mlbench.tasks.task5a.runtime import open_shards

    if data_dir is None:
        fineweb.download()
    return open_shards(fineweb.default_root() if data_dir is None else pathlib.Path(data_dir).expanduser())


CIFAR10 = register_dataset(Dataset("cifar10", prepare=_load_cifar10, images=True, load=_load_cifar10,
                                   synthetic=_synthetic_cifar10))
EPSILON = register_dataset(Dataset("epsilon", prepare=_load_epsilon, load=_load_epsilon,
                                   synthetic=_synthetic_epsilon))
WIKITEXT2 = register_dataset(Dataset("wikitext2", prepare=_prepare_wikitext2))
WMT17 = register_dataset(Dataset("wmt17-en-de", prepare=_prepare_wmt17))
FINEWEB10B = register_dataset(Dataset("fineweb10B", prepare=_prepare_fineweb))

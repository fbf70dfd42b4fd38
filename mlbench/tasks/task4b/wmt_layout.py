"""WMT17 en-de's plain-text layout: the four files of a data folder, torch-free.

The loader (:mod:`mlbench.tasks.task4b.wmt`, which imports torch through the download helpers)
and the data's identity (:mod:`mlbench.tasks.data.identity`, which must not) both take from here
the file names, the default folder and the rule that the two sides of a split are line-aligned.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable

from mlbench.errors import DataError
from mlbench.tasks.data.paths import default_data_root

__all__ = ["FILES", "LANGS", "TEST", "TRAIN", "aligned_pairs", "default_folder"]

LANGS = ("en", "de")
TRAIN, TEST = "train", "newstest2014"
FILES = tuple(f"{split}.{lang}" for split in (TRAIN, TEST) for lang in LANGS)


def default_folder() -> pathlib.Path:
    """Where WMT17 en-de is downloaded to and read from without ``--data-dir``."""
    return default_data_root() / "wmt17-en-de"


def aligned_pairs(folder: pathlib.Path, lines: Callable[[pathlib.Path], int]) -> dict[str, int]:
    """Sentence pairs per split (``train``, ``newstest2014``) of ``folder``, each side's lines
    counted by ``lines``; a DataError when the two sides of a split have different counts."""
    pairs = {}
    for split in (TRAIN, TEST):
        counts = {lang: lines(folder / f"{split}.{lang}") for lang in LANGS}
        if counts["en"] != counts["de"]:
            raise DataError(f"{folder / (split + '.en')} has {counts['en']} lines but "
                            f"{folder / (split + '.de')} has {counts['de']}; the two sides of a parallel "
                            "corpus must be line-aligned")
        pairs[split] = counts["en"]
    return pairs

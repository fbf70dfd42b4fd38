"""Wikitext-2, the data set of task 3a, as token-id streams through a binary cache.

Merity et al. 2017, "Pointer Sentinel Mixture Models" (ICLR, arXiv:1609.07843): the word-level
version 1, as the AWD-LSTM paper and the original MLBench used it.

Source: ``https://wikitext.smerity.com/wikitext-2-v1.zip`` (4.5 MB, md5
542ccefacc6c27f945fb54453812b3cd), the author's mirror of the paper's address
``https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-2-v1.zip``, which answers 403
today. The archive holds ``wikitext-2/wiki.{train,valid,test}.tokens``: 36,718 / 3,760 / 4,358
lines, 2,088,628 / 217,646 / 245,569 tokens once every line ends with ``<eos>``, 33,278 words.

Tokenisation is the reference's (salesforce/awd-lstm-lm ``data.py``): split each line on
whitespace and append ``<eos>`` (blank lines too); the vocabulary numbers words in order of first
appearance over train, valid and test. The id streams are written once per source folder to
``default_data_root()/wikitext2-cache`` (int32 ``.npy`` + ``vocab.txt``) and memory-mapped by
every worker afterwards, as the LIBSVM cache is.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
import zipfile
from typing import NamedTuple

import numpy as np

from mlbench.errors import DataError
from mlbench.tasks.data.download import DOWNLOAD_ERRORS, exclusive, fetch, one_line
from mlbench.tasks.data.download import default_data_root as default_data_root  # still importable from here
from mlbench.tasks.task3a.wikitext_layout import (EOS, FILES, FOLDER, cache_entry, cache_key, default_cache_root,
                                                  default_root, find_folder, is_current)

URL = "https://wikitext.smerity.com/wikitext-2-v1.zip"
MD5 = "542ccefacc6c27f945fb54453812b3cd"


class Corpus(NamedTuple):
    """Token ids of the three splits (int32, memory-mapped) and the vocabulary (id -> word)."""

    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    vocab: list[str]


_NAMES = "wiki.train.tokens, wiki.valid.tokens and wiki.test.tokens (from wikitext-2-v1.zip, " + URL + ")"


def _hint(where: str) -> str:
    return f"put {_NAMES} into {where} or pass --data-dir DIR holding them"


def load_wikitext2(data_dir: str | os.PathLike | None = None, download: bool = True) -> Corpus:
    """Wikitext-2 from ``data_dir`` (the three files, directly or in ``wikitext-2/``) or, with
    ``data_dir`` None, from ``default_data_root()/wikitext2``, downloaded there on first use."""
    if data_dir is not None:
        folder = _find_files(pathlib.Path(data_dir).expanduser(), f"--data-dir {data_dir}")
    else:
        root = default_root()
        if not (root / FOLDER / FILES["train"]).is_file():
            if not download:
                raise DataError(f"Wikitext-2 is not in {root / FOLDER}; {_hint(str(root / FOLDER))}")
            _download(root)
        folder = _find_files(root, str(root))
    return _cached(folder)


def _find_files(base: pathlib.Path, label: str) -> pathlib.Path:
    folder = find_folder(base)
    if folder is not None:
        return folder
    missing = [name for name in FILES.values() if not (base / name).is_file()]
    raise DataError(f"{label} has no {', '.join(missing)}; it must hold {_NAMES}")


def _download(root: pathlib.Path) -> None:
    """Download and extract the archive into root/wikitext-2 (once, under a lock; the archive is
    removed afterwards; an interrupted extraction never looks complete)."""
    root.mkdir(parents=True, exist_ok=True)
    with exclusive(root / ".lock"):
        if (root / FOLDER / FILES["train"]).is_file():
            return
        archive = root / "wikitext-2-v1.zip"
        staging = pathlib.Path(tempfile.mkdtemp(prefix=".extract-", dir=root))
        try:
            fetch(URL, archive, md5=MD5)
            with zipfile.ZipFile(archive) as zf:
                for name in FILES.values():
                    with zf.open(f"{FOLDER}/{name}") as src, open(staging / name, "wb") as dst:
                        shutil.copyfileobj(src, dst)
            os.replace(staging, root / FOLDER)
        except (*DOWNLOAD_ERRORS, zipfile.BadZipFile, KeyError) as exc:
            raise DataError(f"could not download Wikitext-2 from {URL} ({one_line(exc)}); "
                            f"{_hint(str(root / FOLDER))}") from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            archive.unlink(missing_ok=True)


def _cached(folder: pathlib.Path) -> Corpus:
    """The corpus from its cache entry, built first when missing or older than the files."""
    folder = folder.resolve()
    key = cache_key(folder)
    cache_root = default_cache_root()
    entry = cache_entry(folder)
    if not is_current(entry, key):
        try:
            with exclusive(cache_root / f".{entry.name}.lock"):
                if not is_current(entry, key):
                    _build(folder, entry, key)
        except OSError as exc:
            raise DataError(f"could not write the Wikitext-2 cache in {cache_root} ({one_line(exc)}); "
                            "free disk space there or set MLBENCH_DATA to another folder") from None
    train, valid, test = (np.load(entry / f"{split}.npy", mmap_mode="r") for split in FILES)
    vocab = (entry / "vocab.txt").read_text(encoding="utf-8").split("\n")
    return Corpus(train, valid, test, vocab)


def tokenize(paths: list[pathlib.Path]) -> tuple[list[np.ndarray], list[str]]:
    """Id streams of the files (words split on whitespace, ``<eos>`` after every line) and the
    vocabulary in order of first appearance over the files, as the reference numbers it."""
    index: dict[str, int] = {}
    streams = []
    for path in paths:
        ids: list[int] = []
        try:
            with open(path, encoding="utf-8") as handle:
                for line in handle:
                    for word in line.split() + [EOS]:
                        ids.append(index.setdefault(word, len(index)))
        except (OSError, UnicodeDecodeError) as exc:
            raise DataError(f"cannot read {path} ({one_line(exc)}); replace it with the file from "
                            "wikitext-2-v1.zip") from None
        if len(ids) < 2:
            raise DataError(f"{path} is empty; replace it with the file from wikitext-2-v1.zip")
        streams.append(np.asarray(ids, dtype=np.int32))
    return streams, list(index)


def _build(folder: pathlib.Path, entry: pathlib.Path, key: dict) -> None:
    streams, vocab = tokenize([folder / name for name in FILES.values()])
    entry.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    try:
        for split, stream in zip(FILES, streams):
            np.save(staging / f"{split}.npy", stream)
        (staging / "vocab.txt").write_text("\n".join(vocab), encoding="utf-8")
        (staging / "meta.json").write_text(json.dumps(key))
        shutil.rmtree(entry, ignore_errors=True)
        os.replace(staging, entry)
    finally:
        shutil.rmtree(staging, ignore_errors=True)

"""What data a run trained on, and whether it is its task's specified data set.

A run is closed division only when it trained on the data set its task specifies, file for
file: a 1,500-image subset of CIFAR-10, or a small LIBSVM file named like epsilon, is open
division. :func:`data_identity` finds the files mlbench's loader reads for a data set (from the
run's ``--data-dir``, or the default data folder), hashes them, counts their samples and judges
them against the specification:

- **cifar10**: official when ``data_batch_1`` .. ``data_batch_5`` and ``test_batch`` all have
  the md5 of the official python version (:data:`CIFAR10_MD5`, the table torchvision's
  ``datasets/cifar.py`` checks). Rows are the label counts of the batches. A faithful rebuild
  (the same images, pickled again) has the counts but not the md5s: not official.
- **epsilon**: the LIBSVM site publishes no checksums, so epsilon is judged by its
  specification (docs/tasks.md, task 2a): the pair ``epsilon_normalized[.bz2]`` /
  ``epsilon_normalized.t[.bz2]`` with 400,000 and 100,000 rows and 2,000 features. Rows and
  width come from the headers of the binary cache the loader built, not from the text again.
  A file of epsilon's names and shape but other values passes this check; its sha256 still
  tells it apart from the real one.
- **wikitext2**: official by the token counts of the v1 release as mlbench's tokenizer counts
  them (words split on whitespace and an ``<eos>`` per line): 2,088,628 / 217,646 / 245,569
  tokens and 33,278 words (Merity et al. 2017, table 1, whose counts include the line ends; the
  same as AWD-LSTM's and torchtext's readers count). The counts come from the loader's cache
  when it is current, else from the text.
- **wmt17-en-de**: the test set is judged by its 3,003 sentence pairs (newstest2014, the full
  version sacreBLEU's ``wmt14/full`` reads). The training corpus, Europarl v7, Common Crawl and
  News Commentary v12 as mlbench concatenates them, has no published line count that could be
  confirmed: the counts found are WMT17's table of sentences per corpus, and whether News
  Commentary v12's figure is its file's line count is not known here. So the training side is
  not judged: its pairs and hashes are recorded, and two runs compare by their sha256.
- **fineweb10B**: official when the folder holds FineWeb's 103 train shards and its validation
  shard, each with the SHA-256 of the Hub's listing (``manifest.json``, kept by the download:
  :mod:`mlbench.tasks.task5a.fineweb`). Rows are the tokens the shards' headers count.

Hashing is costly on repeat (CIFAR-10 is 180 MB, epsilon's files several GB), so each file's
SHA-256 (and md5, line count, sample count where asked for) is computed once and kept in
``<data>/file-digests.json``, keyed by resolved path, size and mtime_ns; a data folder that
cannot be written just computes them each time.

This module is torch-free (NumPy and the standard library), so that the CLI can call it without
importing torch. The loaders import torch at their top, so what this module shares with them is
kept in torch-free modules that both import: the data folder (:mod:`.paths`), CIFAR-10's file
names and the pickle globals a batch may use (:mod:`.cifar10_layout`), the LIBSVM pair and the
cache entry of each file (:mod:`.libsvm_layout`), Wikitext-2's files and cache entry
(:mod:`mlbench.tasks.task3a.wikitext_layout`) and WMT17's files (:mod:`mlbench.tasks.task4b.wmt_layout`).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlbench.errors import DataError, MlbenchError, UsageError
from mlbench.jsonfile import write_json_atomic
from mlbench.tasks.data import cifar10_layout, libsvm_layout
from mlbench.tasks.data.paths import default_data_root, one_line
from mlbench.tasks.task3a import wikitext_layout
from mlbench.tasks.task4b import wmt_layout

__all__ = ["CIFAR10_MD5", "DIGEST_CACHE", "DataIdentity", "data_identity"]

#: The file in the data folder that keeps every hashed file's digests.
DIGEST_CACHE = "file-digests.json"
_READ_BYTES = 1 << 22


@dataclass(frozen=True)
class DataIdentity:
    """What data a run trained on, and whether it is its task's specified data set."""

    dataset: str  # the task's data set name: "cifar10", "epsilon", "wikitext2", "wmt17-en-de"
    official: bool  # True only when this is the specified data set, file for file
    reason: str | None  # None when official; else a phrase a user reads after "open: data "
    rows: dict[str, int]  # samples (tokens, sentence pairs) per split
    features: int | None  # LIBSVM width; None where it does not apply
    files: tuple[dict, ...]  # each {"name": relative file name, "bytes": int, "sha256": hex}
    sha256: str  # one hash over the files' names and hashes

    def to_dict(self) -> dict:
        return {"dataset": self.dataset, "official": self.official, "reason": self.reason, "rows": dict(self.rows),
                "features": self.features, "files": [dict(f) for f in self.files], "sha256": self.sha256}

    @classmethod
    def from_dict(cls, data: dict) -> DataIdentity:
        return cls(dataset=str(data["dataset"]), official=bool(data["official"]),
                   reason=None if data.get("reason") is None else str(data["reason"]),
                   rows={str(split): int(n) for split, n in data["rows"].items()},
                   features=None if data.get("features") is None else int(data["features"]),
                   files=tuple({"name": str(f["name"]), "bytes": int(f["bytes"]), "sha256": str(f["sha256"])}
                               for f in data["files"]),
                   sha256=str(data["sha256"]))


def data_identity(dataset: str, data_dir: str | None) -> DataIdentity:
    """The identity of ``dataset`` as a run given ``data_dir`` (None: the default data folder)
    reads it, once mlbench's loader has prepared it (downloaded, converted, cached).

    An unknown data set name is a UsageError; missing files are a DataError.
    """
    judge = _JUDGES.get(dataset)
    if judge is None:
        raise UsageError(f"unknown data set {dataset!r}; mlbench knows {_and(list(_JUDGES))}")
    digests = _Digests(default_data_root() / DIGEST_CACHE)
    try:
        return judge(data_dir, digests)
    finally:
        digests.save()


# --- the files' digests, computed once ------------------------------------------------------


class _Digests:
    """Each file's sha256 (md5, lines, samples when asked for) by resolved path, size and mtime_ns.

    Two processes saving at once keep the entries of the last one; the other's are computed
    again when next asked for, which costs time, never a wrong digest.
    """

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            entries = {}
        self.entries: dict[str, Any] = entries if isinstance(entries, dict) else {}
        self.changed = False

    def of(self, path: pathlib.Path, md5: bool = False,
           samples: Callable[[pathlib.Path], int] | None = None) -> dict[str, Any]:
        """{"size", "mtime_ns", "sha256", "lines"} of ``path``, with "md5" and "samples" (counted
        by ``samples``) when asked for."""
        source = path.resolve()
        before = _stat(source)
        entry = self.entries.get(str(source))
        if not (isinstance(entry, dict) and [entry.get("size"), entry.get("mtime_ns")] == before
                and "sha256" in entry):
            entry = {"size": before[0], "mtime_ns": before[1], **_read(source, md5)}
        elif md5 and "md5" not in entry:
            entry = {**entry, **_read(source, md5)}
        if samples is not None and "samples" not in entry:
            entry = {**entry, "samples": samples(source)}
        if _stat(source) == before and entry is not self.entries.get(str(source)):
            self.entries[str(source)] = entry  # not kept when the file changed while it was read
            self.changed = True
        return entry

    def save(self) -> None:
        if not self.changed:
            return
        kept = {path: entry for path, entry in self.entries.items() if os.path.exists(path)}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.path, kept)
        except (OSError, MlbenchError):
            pass  # a read-only data folder: the digests are computed again next time


def _stat(path: pathlib.Path) -> list[int]:
    try:
        stat = path.stat()
    except OSError as exc:
        raise DataError(f"cannot read {path} ({one_line(exc)}); prepare the data set again") from None
    return [stat.st_size, stat.st_mtime_ns]


def _read(path: pathlib.Path, md5: bool) -> dict[str, Any]:
    """sha256, md5 if asked for, and the line count (a last line without a newline counts)."""
    sha = hashlib.sha256()
    md = hashlib.md5(usedforsecurity=False) if md5 else None
    lines, last = 0, b"\n"
    try:
        with open(path, "rb") as handle:
            while block := handle.read(_READ_BYTES):
                sha.update(block)
                if md is not None:
                    md.update(block)
                lines += block.count(b"\n")
                last = block[-1:]
    except OSError as exc:
        raise DataError(f"cannot read {path} ({one_line(exc)}); prepare the data set again") from None
    facts: dict[str, Any] = {"sha256": sha.hexdigest(), "lines": lines + (last != b"\n")}
    if md is not None:
        facts["md5"] = md.hexdigest()
    return facts


def _identity(dataset: str, reasons: list[str], rows: dict[str, int], features: int | None,
              named: list[tuple[str, dict[str, Any]]]) -> DataIdentity:
    files = tuple({"name": name, "bytes": facts["size"], "sha256": facts["sha256"]} for name, facts in named)
    whole = hashlib.sha256("".join(f"{f['name']}\0{f['sha256']}\n" for f in files).encode()).hexdigest()
    return DataIdentity(dataset=dataset, official=not reasons, reason="; ".join(reasons) or None, rows=rows,
                        features=features, files=files, sha256=whole)


def _counts_differ(found: dict[str, int], spec: dict[str, int], what: dict[str, str], whose: str) -> list[str]:
    return [f"{found[split]:,} {what[split]}, not {whose} {spec[split]:,}" for split in spec
            if found.get(split) != spec[split]]


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _npy_rows(path: pathlib.Path) -> tuple[int, ...]:
    """The shape in an .npy file's header (the array itself is not read)."""
    with open(path, "rb") as handle:
        major, _ = np.lib.format.read_magic(handle)
        header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        return tuple(header(handle)[0])


# --- CIFAR-10 (mlbench.tasks.data.cifar10) --------------------------------------------------

#: The md5 of each extracted file of the official python version (torchvision's datasets/cifar.py).
CIFAR10_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
}
CIFAR10_ROWS = {"train": 50_000, "test": 10_000}
def _cifar10(data_dir: str | None, digests: _Digests) -> DataIdentity:
    names = list(cifar10_layout.FILES)
    folder = _cifar10_folder(data_dir)
    facts = {name: digests.of(folder / name, md5=True, samples=_cifar10_labels) for name in names}
    rows = {"train": sum(facts[name]["samples"] for name in cifar10_layout.TRAIN_FILES),
            "test": facts[cifar10_layout.TEST_FILE]["samples"]}
    differ = [name for name in names if facts[name]["md5"] != CIFAR10_MD5.get(name)]
    reasons = []
    if differ:
        reasons = _counts_differ(rows, CIFAR10_ROWS, {"train": "training images", "test": "test images"},
                                 "CIFAR-10's")
        which = f"{differ[0]}'s md5 differs" if len(differ) == 1 else f"the md5s of {_and(differ)} differ"
        reasons = reasons or [f"not the official CIFAR-10 files ({which})"]
    return _identity("cifar10", reasons, rows, None, [(name, facts[name]) for name in names])


def _cifar10_folder(data_dir: str | None) -> pathlib.Path:
    """The folder of the batch files, as the loader finds it (given it or its parent)."""
    folder_name = cifar10_layout.FOLDER
    if data_dir is None:
        folder = cifar10_layout.default_root() / folder_name
    else:
        base = pathlib.Path(data_dir).expanduser()
        if not base.is_dir():
            raise DataError(f"the data folder {base} does not exist; pass the folder that holds {folder_name}/")
        folder = cifar10_layout.batches_folder(base)
    missing = cifar10_layout.missing(folder)
    if missing:
        raise DataError(f"CIFAR-10 in {folder} lacks {_and(missing)}; put the complete official python version "
                        f"({folder_name}/) there")
    return folder


def _cifar10_labels(path: pathlib.Path) -> int:
    entry = cifar10_layout.load_batch(path)
    try:
        return len(entry["labels"])
    except Exception as exc:  # whatever the pickle holds instead of a dict with labels
        raise cifar10_layout.unreadable(path, exc) from None


# --- epsilon and any LIBSVM pair (mlbench.tasks.data.libsvm) --------------------------------

EPSILON_STEM = libsvm_layout.STEMS["epsilon"]
EPSILON_ROWS = {"train": 400_000, "test": 100_000}
EPSILON_FEATURES = 2_000


def _epsilon(data_dir: str | None, digests: _Digests) -> DataIdentity:
    folder = pathlib.Path(data_dir).expanduser() if data_dir is not None else libsvm_layout.default_folder("epsilon")
    pair = libsvm_layout.find_pair(folder, "epsilon")
    shapes = [_libsvm_shape(path) for path in pair]
    rows = {"train": shapes[0][0], "test": shapes[1][0]}
    features = max(shape[1] for shape in shapes)
    stem = pair[0].name.removesuffix(".bz2")
    if stem != EPSILON_STEM:
        reasons = [f"{stem}, not epsilon"]
    else:
        reasons = _counts_differ(rows, EPSILON_ROWS, {"train": "training rows", "test": "test rows"}, "epsilon's")
        if features != EPSILON_FEATURES:
            reasons.append(f"{features:,} features, not epsilon's {EPSILON_FEATURES:,}")
    return _identity("epsilon", reasons, rows, features, [(path.name, digests.of(path)) for path in pair])


def _libsvm_shape(path: pathlib.Path) -> tuple[int, ...]:
    """(rows, width) of the file's own binary cache entry (the width n_features=None), the one
    libsvm.read_libsvm(path) reads."""
    source = path.resolve()
    size, mtime_ns = _stat(source)
    cache = libsvm_layout.default_cache_root()
    entry = libsvm_layout.cache_entry(cache, source, None)
    try:
        current = libsvm_layout.is_current(entry, libsvm_layout.cache_key(source, size, mtime_ns, None))
        shape = _npy_rows(entry / "x.npy") if current else ()
    except (OSError, ValueError, AttributeError):
        shape = ()
    if len(shape) != 2:
        raise DataError(f"{source} has no current binary cache in {cache}; load the data set once "
                        "(a run of task 2a does) before asking what it is")
    return shape


# --- Wikitext-2 (mlbench.tasks.task3a.wikitext) ---------------------------------------------

WIKITEXT2_TOKENS = {"train": 2_088_628, "valid": 217_646, "test": 245_569}
WIKITEXT2_VOCAB = 33_278


def _wikitext2(data_dir: str | None, digests: _Digests) -> DataIdentity:
    base = pathlib.Path(data_dir).expanduser() if data_dir is not None else wikitext_layout.default_root()
    folder = wikitext_layout.find_folder(base)
    if folder is None:
        missing = [name for name in wikitext_layout.FILES.values() if not (base / name).is_file()]
        raise DataError(f"{base} has no {_and(missing)}; it must hold {_and(list(wikitext_layout.FILES.values()))} "
                        "from wikitext-2-v1.zip")
    tokens, vocab = _wikitext2_cached(folder) or _wikitext2_counted(folder)
    reasons = _counts_differ(tokens, WIKITEXT2_TOKENS, {"train": "training tokens", "valid": "validation tokens",
                                                        "test": "test tokens"}, "Wikitext-2's")
    if vocab != WIKITEXT2_VOCAB:
        reasons.append(f"a vocabulary of {vocab:,} words, not Wikitext-2's {WIKITEXT2_VOCAB:,}")
    named = [(name, digests.of(folder / name)) for name in wikitext_layout.FILES.values()]
    return _identity("wikitext2", reasons, tokens, None, named)


def _wikitext2_cached(folder: pathlib.Path) -> tuple[dict[str, int], int] | None:
    """Tokens per split and vocabulary size from the loader's cache entry, when it is current."""
    folder = folder.resolve()
    entry = wikitext_layout.cache_entry(folder)
    try:
        if not wikitext_layout.is_current(entry, wikitext_layout.cache_key(folder)):
            return None
        tokens = {split: _npy_rows(entry / f"{split}.npy")[0] for split in wikitext_layout.FILES}
        words = (entry / "vocab.txt").read_bytes()
    except (OSError, ValueError, AttributeError, IndexError):
        return None
    return tokens, (words.count(b"\n") + 1 if words else 0)


def _wikitext2_counted(folder: pathlib.Path) -> tuple[dict[str, int], int]:
    """Tokens per split and vocabulary size counted as wikitext.tokenize counts them."""
    tokens, vocab = {}, {wikitext_layout.EOS}
    for split, name in wikitext_layout.FILES.items():
        count = 0
        try:
            with open(folder / name, encoding="utf-8") as handle:
                for line in handle:
                    words = line.split()
                    count += len(words) + 1
                    vocab.update(words)
        except (OSError, UnicodeDecodeError) as exc:
            raise DataError(f"cannot read {folder / name} ({one_line(exc)}); replace it with the file from "
                            "wikitext-2-v1.zip") from None
        tokens[split] = count
    return tokens, len(vocab)


# --- WMT17 en-de (mlbench.tasks.task4b.wmt) --------------------------------------------------

NEWSTEST2014_PAIRS = 3_003


def _wmt17(data_dir: str | None, digests: _Digests) -> DataIdentity:
    folder = pathlib.Path(data_dir).expanduser() if data_dir is not None else wmt_layout.default_folder()
    paths = [folder / name for name in wmt_layout.FILES]
    for path in paths:  # all four first, as wmt.wmt17_folder checks them
        if not path.is_file() or path.stat().st_size == 0:
            raise DataError(f"{path} is {'empty' if path.is_file() else 'missing'}; the folder must hold "
                            f"{_and([p.name for p in paths])}")
    facts = {path.name: digests.of(path) for path in paths}
    pairs = wmt_layout.aligned_pairs(folder, lambda path: facts[path.name]["lines"])
    rows = {"train": pairs[wmt_layout.TRAIN], "test": pairs[wmt_layout.TEST]}
    reasons = _counts_differ(rows, {"test": NEWSTEST2014_PAIRS}, {"test": "test sentence pairs"}, "newstest2014's")
    return _identity("wmt17-en-de", reasons, rows, None, list(facts.items()))


def _fineweb(data_dir: str | None, digests: _Digests) -> DataIdentity:
    from mlbench.tasks.task5a import fineweb
    from mlbench.tasks.task5a.shards import TRAIN_PATTERN, VAL_PATTERN, find_shards, read_header

    folder = pathlib.Path(data_dir).expanduser() if data_dir is not None else fineweb.default_root()
    train, val = find_shards(folder, TRAIN_PATTERN), find_shards(folder, VAL_PATTERN)
    if not train or not val:
        raise DataError(f"{folder} holds no {'train' if not train else 'validation'} shard "
                        f"({TRAIN_PATTERN if not train else VAL_PATTERN})")
    rows = {"train": sum(read_header(p) for p in train), "valid": read_header(val[0])}
    named = [(p.name, digests.of(p)) for p in [val[0], *train]]
    reasons: list[str] = []
    try:
        listed = fineweb.manifest(folder, fetch_missing=False)
    except DataError:
        listed = {}
        reasons.append("token shards without FineWeb's manifest (not the speedrun's download)")
    if listed:
        wrong = [name for name, facts in named if name not in listed or listed[name].sha256 != facts["sha256"]]
        if wrong:
            reasons.append(f"{_and(wrong[:3])}{' and more' if len(wrong) > 3 else ''} differ from FineWeb's listing")
        if len(train) != fineweb.TRAIN_SHARDS:
            reasons.append(f"{len(train)} of FineWeb's {fineweb.TRAIN_SHARDS} train shards")
    return _identity("fineweb10B", reasons, rows, None, named)


_JUDGES: dict[str, Callable[[str | None, _Digests], DataIdentity]] = {
    "cifar10": _cifar10,
    "epsilon": _epsilon,
    "wikitext2": _wikitext2,
    "wmt17-en-de": _wmt17,
    "fineweb10B": _fineweb,
}

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

Hashing is costly on repeat (CIFAR-10 is 180 MB, epsilon's files several GB), so each file's
SHA-256 (and md5, line count, sample count where asked for) is computed once and kept in
``<data>/file-digests.json``, keyed by resolved path, size and mtime_ns; a data folder that
cannot be written just computes them each time.

This module is torch-free (NumPy and the standard library), so that the CLI can call it without
importing torch. The loaders import torch at their top, so the few facts of theirs it needs
(where each data set's files are, the pickle globals a CIFAR-10 batch may use, where the LIBSVM
and Wikitext-2 caches are) are repeated here; tests/test_data_identity.py holds them equal to
the loaders'.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlbench.errors import DataError, MlbenchError, UsageError
from mlbench.jsonfile import write_json_atomic

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
    digests = _Digests(_data_root() / DIGEST_CACHE)
    try:
        return judge(data_dir, digests)
    finally:
        digests.save()


# --- the files' digests, computed once ------------------------------------------------------


def _data_root() -> pathlib.Path:
    """mlbench.tasks.data.download.default_data_root, without importing torch (download.py does)."""
    env = os.environ.get("MLBENCH_DATA")
    if env:
        return pathlib.Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = pathlib.Path(xdg) if os.path.isabs(xdg) else pathlib.Path.home() / ".cache"
    return base / "mlbench" / "data"


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
        raise DataError(f"cannot read {path} ({_one_line(exc)}); prepare the data set again") from None
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
        raise DataError(f"cannot read {path} ({_one_line(exc)}); prepare the data set again") from None
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


def _one_line(exc: BaseException) -> str:
    return (" ".join(str(exc).split()) or type(exc).__name__).rstrip(".")


def _npy_rows(path: pathlib.Path) -> tuple[int, ...]:
    """The shape in an .npy file's header (the array itself is not read)."""
    with open(path, "rb") as handle:
        major, _ = np.lib.format.read_magic(handle)
        header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        return tuple(header(handle)[0])


# --- CIFAR-10 (mlbench.tasks.data.cifar10) --------------------------------------------------

CIFAR10_FOLDER = "cifar-10-batches-py"
_CIFAR10_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
_CIFAR10_TEST = "test_batch"
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
#: The globals a CIFAR-10 batch may refer to (cifar10._ALLOWED_GLOBALS): a tampered file runs no code.
_CIFAR10_GLOBALS = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("_codecs", "encode"),
}


class _BatchUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in _CIFAR10_GLOBALS:
            raise pickle.UnpicklingError(f"it refers to {module}.{name}, which a CIFAR-10 batch never does")
        return super().find_class(module, name)


def _cifar10(data_dir: str | None, digests: _Digests) -> DataIdentity:
    names = [*_CIFAR10_TRAIN, _CIFAR10_TEST]
    folder = _cifar10_folder(data_dir, names)
    facts = {name: digests.of(folder / name, md5=True, samples=_cifar10_labels) for name in names}
    rows = {"train": sum(facts[name]["samples"] for name in _CIFAR10_TRAIN), "test": facts[_CIFAR10_TEST]["samples"]}
    differ = [name for name in names if facts[name]["md5"] != CIFAR10_MD5.get(name)]
    reasons = []
    if differ:
        reasons = _counts_differ(rows, CIFAR10_ROWS, {"train": "training images", "test": "test images"},
                                 "CIFAR-10's")
        which = f"{differ[0]}'s md5 differs" if len(differ) == 1 else f"the md5s of {_and(differ)} differ"
        reasons = reasons or [f"not the official CIFAR-10 files ({which})"]
    return _identity("cifar10", reasons, rows, None, [(name, facts[name]) for name in names])


def _cifar10_folder(data_dir: str | None, names: list[str]) -> pathlib.Path:
    """The folder of the batch files (cifar10._batches_folder: given it or its parent)."""
    if data_dir is None:
        folder = _data_root() / "cifar10" / CIFAR10_FOLDER
    else:
        base = pathlib.Path(data_dir).expanduser()
        if not base.is_dir():
            raise DataError(f"the data folder {base} does not exist; pass the folder that holds {CIFAR10_FOLDER}/")
        folder = base / CIFAR10_FOLDER if (base / CIFAR10_FOLDER).is_dir() else base
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise DataError(f"CIFAR-10 in {folder} lacks {_and(missing)}; put the complete official python version "
                        f"({CIFAR10_FOLDER}/) there")
    return folder


def _cifar10_labels(path: pathlib.Path) -> int:
    try:
        with open(path, "rb") as handle:
            entry = _BatchUnpickler(handle, encoding="latin1").load()
        return len(entry["labels"])
    except Exception as exc:  # a corrupt pickle can fail with almost any exception type
        raise DataError(f"{path} is not a readable CIFAR-10 batch ({_one_line(exc)}); replace it with the file "
                        "from the official python version") from None


# --- epsilon and any LIBSVM pair (mlbench.tasks.data.libsvm) --------------------------------

EPSILON_STEM = "epsilon_normalized"
EPSILON_ROWS = {"train": 400_000, "test": 100_000}
EPSILON_FEATURES = 2_000


def _epsilon(data_dir: str | None, digests: _Digests) -> DataIdentity:
    folder = pathlib.Path(data_dir).expanduser() if data_dir is not None else _data_root() / "epsilon"
    pair = _libsvm_pair(folder)
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


def _libsvm_pair(folder: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """The pair libsvm.find_pair(folder, "epsilon") reads: epsilon's names if there, else the only pair."""
    if not folder.is_dir():
        raise DataError(f"the data folder {folder} does not exist; put {EPSILON_STEM}[.bz2] and "
                        f"{EPSILON_STEM}.t[.bz2] in it or pass --data-dir DIR")
    named = _pick_pair(folder, EPSILON_STEM)
    if named is not None:
        return named
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    bases = sorted({f.removesuffix(".bz2") for f in files if not f.removesuffix(".bz2").endswith(".t")})
    pairs = [pair for pair in (_pick_pair(folder, base) for base in bases) if pair is not None]
    if not pairs:
        raise DataError(f"no LIBSVM pair (a training file F and its test file F.t, each optionally .bz2) in "
                        f"{folder}; put {EPSILON_STEM}[.bz2] and {EPSILON_STEM}.t[.bz2] there")
    if len(pairs) > 1:
        raise DataError(f"{folder} holds several LIBSVM pairs ({_and([train.name for train, _ in pairs])}) and none "
                        f"named {EPSILON_STEM}; keep one training file F and its test file F.t there")
    return pairs[0]


def _pick_pair(folder: pathlib.Path, base: str) -> tuple[pathlib.Path, pathlib.Path] | None:
    def pick(name: str) -> pathlib.Path | None:
        return next((p for p in (folder / name, folder / f"{name}.bz2") if p.is_file()), None)

    train, test = pick(base), pick(f"{base}.t")
    return (train, test) if train and test else None


def _libsvm_shape(path: pathlib.Path) -> tuple[int, ...]:
    """(rows, width) of the file's own binary cache entry, as libsvm.read_libsvm(path) names it."""
    source = path.resolve()
    size, mtime_ns = _stat(source)
    cache = _data_root() / "libsvm-cache"
    key = hashlib.sha1(f"{source}\0None".encode()).hexdigest()[:16]  # the width n_features=None
    entry = cache / f"{source.name}-{key}"
    try:
        meta = json.loads((entry / "meta.json").read_text(encoding="utf-8"))
        current = [meta.get(k) for k in ("source", "size", "mtime_ns", "n_features")] == [
            str(source), size, mtime_ns, None]
        shape = _npy_rows(entry / "x.npy") if current else ()
    except (OSError, ValueError, AttributeError):
        shape = ()
    if len(shape) != 2:
        raise DataError(f"{source} has no current binary cache in {cache}; load the data set once "
                        "(a run of task 2a does) before asking what it is")
    return shape


# --- Wikitext-2 (mlbench.tasks.task3a.wikitext) ---------------------------------------------

WIKITEXT2_FILES = {"train": "wiki.train.tokens", "valid": "wiki.valid.tokens", "test": "wiki.test.tokens"}
WIKITEXT2_TOKENS = {"train": 2_088_628, "valid": 217_646, "test": 245_569}
WIKITEXT2_VOCAB = 33_278
_WIKITEXT2_FOLDER = "wikitext-2"
_EOS = "<eos>"


def _wikitext2(data_dir: str | None, digests: _Digests) -> DataIdentity:
    base = pathlib.Path(data_dir).expanduser() if data_dir is not None else _data_root() / "wikitext2"
    folder = next((f for f in (base, base / _WIKITEXT2_FOLDER)
                   if all((f / name).is_file() for name in WIKITEXT2_FILES.values())), None)
    if folder is None:
        missing = [name for name in WIKITEXT2_FILES.values() if not (base / name).is_file()]
        raise DataError(f"{base} has no {_and(missing)}; it must hold {_and(list(WIKITEXT2_FILES.values()))} "
                        "from wikitext-2-v1.zip")
    tokens, vocab = _wikitext2_cached(folder) or _wikitext2_counted(folder)
    reasons = _counts_differ(tokens, WIKITEXT2_TOKENS, {"train": "training tokens", "valid": "validation tokens",
                                                        "test": "test tokens"}, "Wikitext-2's")
    if vocab != WIKITEXT2_VOCAB:
        reasons.append(f"a vocabulary of {vocab:,} words, not Wikitext-2's {WIKITEXT2_VOCAB:,}")
    named = [(name, digests.of(folder / name)) for name in WIKITEXT2_FILES.values()]
    return _identity("wikitext2", reasons, tokens, None, named)


def _wikitext2_cached(folder: pathlib.Path) -> tuple[dict[str, int], int] | None:
    """Tokens per split and vocabulary size from the loader's cache entry, when it is current."""
    folder = folder.resolve()
    entry = _data_root() / "wikitext2-cache" / hashlib.sha1(str(folder).encode()).hexdigest()[:16]
    try:
        meta = json.loads((entry / "meta.json").read_text(encoding="utf-8"))
        files = {name: _stat(folder / name) for name in WIKITEXT2_FILES.values()}
        if meta.get("source") != str(folder) or meta.get("files") != files:
            return None
        tokens = {split: _npy_rows(entry / f"{split}.npy")[0] for split in WIKITEXT2_FILES}
        words = (entry / "vocab.txt").read_bytes()
    except (OSError, ValueError, AttributeError, IndexError):
        return None
    return tokens, (words.count(b"\n") + 1 if words else 0)


def _wikitext2_counted(folder: pathlib.Path) -> tuple[dict[str, int], int]:
    """Tokens per split and vocabulary size counted as wikitext.tokenize counts them."""
    tokens, vocab = {}, {_EOS}
    for split, name in WIKITEXT2_FILES.items():
        count = 0
        try:
            with open(folder / name, encoding="utf-8") as handle:
                for line in handle:
                    words = line.split()
                    count += len(words) + 1
                    vocab.update(words)
        except (OSError, UnicodeDecodeError) as exc:
            raise DataError(f"cannot read {folder / name} ({_one_line(exc)}); replace it with the file from "
                            "wikitext-2-v1.zip") from None
        tokens[split] = count
    return tokens, len(vocab)


# --- WMT17 en-de (mlbench.tasks.task4b.wmt) --------------------------------------------------

WMT17_SPLITS = {"train": "train", "test": "newstest2014"}
NEWSTEST2014_PAIRS = 3_003


def _wmt17(data_dir: str | None, digests: _Digests) -> DataIdentity:
    folder = pathlib.Path(data_dir).expanduser() if data_dir is not None else _data_root() / "wmt17-en-de"
    paths = [folder / f"{stem}.{lang}" for stem in WMT17_SPLITS.values() for lang in ("en", "de")]
    for path in paths:  # all four first, as wmt.wmt17_folder checks them
        if not path.is_file() or path.stat().st_size == 0:
            raise DataError(f"{path} is {'empty' if path.is_file() else 'missing'}; the folder must hold "
                            f"{_and([p.name for p in paths])}")
    facts = {path.name: digests.of(path) for path in paths}
    rows = {}
    for split, stem in WMT17_SPLITS.items():
        en, de = facts[f"{stem}.en"]["lines"], facts[f"{stem}.de"]["lines"]
        if en != de:
            raise DataError(f"{folder / (stem + '.en')} has {en} lines but {folder / (stem + '.de')} has {de}; "
                            "the two sides of a parallel corpus must be line-aligned")
        rows[split] = en
    reasons = _counts_differ(rows, {"test": NEWSTEST2014_PAIRS}, {"test": "test sentence pairs"}, "newstest2014's")
    return _identity("wmt17-en-de", reasons, rows, None, list(facts.items()))


_JUDGES: dict[str, Callable[[str | None, _Digests], DataIdentity]] = {
    "cifar10": _cifar10,
    "epsilon": _epsilon,
    "wikitext2": _wikitext2,
    "wmt17-en-de": _wmt17,
}

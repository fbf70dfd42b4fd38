"""Where a LIBSVM data set's files are and where their binary cache entries live: torch-free.

The loader (:mod:`mlbench.tasks.data.libsvm`, which imports torch) finds the pair of files and
converts each into a cache entry; the data's identity (:mod:`mlbench.tasks.data.identity`, which
must not import torch) finds the same pair and reads the shape from the same entry. Both take the
rules from here: which pair a folder holds, and the entry and key a file's cache is kept under.
"""

from __future__ import annotations

import hashlib
import json
import pathlib

from mlbench.errors import DataError
from mlbench.tasks.data.paths import default_data_root

__all__ = ["STEMS", "cache_entry", "cache_key", "default_cache_root", "default_folder", "find_pair",
           "is_current", "pick_pair"]

#: The file name (F of the pair F / F.t) that a data set name stands for on the LIBSVM site.
STEMS = {"epsilon": "epsilon_normalized"}


def find_pair(folder: pathlib.Path, name: str = "epsilon") -> tuple[pathlib.Path, pathlib.Path]:
    """The training and test file of a LIBSVM data set in `folder`.

    The LIBSVM site names a test file after its training file plus `.t` (a9a / a9a.t), each
    optionally compressed as .bz2 (the uncompressed file wins when both are there). The pair
    named after `name` (epsilon: epsilon_normalized) is taken if present; otherwise the folder
    must hold exactly one pair, so that `--data-dir DIR` works for any LIBSVM data set.
    """
    stem = STEMS.get(name, name)
    if not folder.is_dir():
        raise DataError(
            f"the data folder {folder} does not exist; put {stem}[.bz2] and {stem}.t[.bz2] in it or pass --data-dir DIR"
        )
    named = pick_pair(folder, stem)
    if named is not None:
        return named
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    bases = sorted({f.removesuffix(".bz2") for f in files if not f.removesuffix(".bz2").endswith(".t")})
    pairs = [pair for pair in (pick_pair(folder, b) for b in bases) if pair is not None]
    if len(pairs) == 1:
        return pairs[0]
    if pairs:
        raise DataError(
            f"{folder} holds several LIBSVM pairs ({', '.join(train.name for train, _ in pairs)}) and none named "
            f"{stem}; keep one training file F and its test file F.t there"
        )
    found = ", ".join(files[:10]) + (f" and {len(files) - 10} more" if len(files) > 10 else "") if files else "nothing"
    raise DataError(
        f"no LIBSVM pair (a training file F and its test file F.t, each optionally .bz2) in {folder} "
        f"(found: {found}); put {stem}[.bz2] and {stem}.t[.bz2] there"
    )


def pick_pair(folder: pathlib.Path, base: str) -> tuple[pathlib.Path, pathlib.Path] | None:
    """``base`` and ``base.t`` in ``folder``, each plain or .bz2 (plain first); None unless both."""
    def pick(name: str) -> pathlib.Path | None:
        return next((p for p in (folder / name, folder / f"{name}.bz2") if p.is_file()), None)

    train, test = pick(base), pick(f"{base}.t")
    return (train, test) if train and test else None


def default_folder(name: str) -> pathlib.Path:
    """Where the LIBSVM data set ``name`` is downloaded to and read from without ``--data-dir``."""
    return default_data_root() / name


def default_cache_root() -> pathlib.Path:
    """The folder of the cache entries unless the caller names another."""
    return default_data_root() / "libsvm-cache"


def cache_entry(cache_root: pathlib.Path, source: pathlib.Path, n_features: int | None) -> pathlib.Path:
    """The cache entry of the resolved file ``source`` read at width ``n_features`` (None: its own)."""
    digest = hashlib.sha1(f"{source}\0{n_features}".encode()).hexdigest()[:16]
    return cache_root / f"{source.name}-{digest}"


def cache_key(source: pathlib.Path, size: int, mtime_ns: int, n_features: int | None) -> dict:
    """What an entry's meta.json says when it is a conversion of ``source`` (of ``size`` bytes,
    modified at ``mtime_ns``) at width ``n_features``; the loader adds the version of its rules."""
    return {"source": str(source), "size": size, "mtime_ns": mtime_ns, "n_features": n_features}


def is_current(entry: pathlib.Path, key: dict) -> bool:
    """Whether ``entry``'s meta.json holds every item of ``key`` (it holds the shape besides)."""
    try:
        meta = json.loads((entry / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    return all(meta.get(k) == v for k, v in key.items())

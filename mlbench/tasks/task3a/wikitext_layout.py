"""Where Wikitext-2's files are and where the loader caches their token ids: torch-free.

The loader (:mod:`mlbench.tasks.task3a.wikitext`, which imports torch through the download
helpers) and the data's identity (:mod:`mlbench.tasks.data.identity`, which must not) both take
from here the file names, the folder they may sit in, the tokenizer's line end, and the cache
entry a folder's token ids are kept in with the key that says it is current.
"""

from __future__ import annotations

import hashlib
import json
import pathlib

from mlbench.tasks.data.paths import default_data_root

__all__ = ["EOS", "FILES", "FOLDER", "cache_entry", "cache_key", "default_cache_root", "default_root", "find_folder",
           "is_current"]

FILES = {"train": "wiki.train.tokens", "valid": "wiki.valid.tokens", "test": "wiki.test.tokens"}
#: The token the tokenizer appends to every line (salesforce/awd-lstm-lm data.py).
EOS = "<eos>"
#: The folder the archive holds the files in.
FOLDER = "wikitext-2"
_CACHE_VERSION = 1


def default_root() -> pathlib.Path:
    """Where Wikitext-2 is downloaded to and read from without ``--data-dir``."""
    return default_data_root() / "wikitext2"


def find_folder(base: pathlib.Path) -> pathlib.Path | None:
    """``base`` or its ``wikitext-2``, whichever holds the three files first; None if neither."""
    return next((folder for folder in (base, base / FOLDER)
                 if all((folder / name).is_file() for name in FILES.values())), None)


def default_cache_root() -> pathlib.Path:
    """The folder of the cache entries (one per source folder)."""
    return default_data_root() / "wikitext2-cache"


def cache_entry(folder: pathlib.Path) -> pathlib.Path:
    """The cache entry of the token ids of the files in the resolved ``folder``."""
    return default_cache_root() / hashlib.sha1(str(folder).encode()).hexdigest()[:16]


def cache_key(folder: pathlib.Path) -> dict:
    """What the entry's meta.json says while it is current: the files' sizes and mtimes (an
    OSError when a file cannot be read)."""
    return {"version": _CACHE_VERSION, "source": str(folder),
            "files": {name: [(folder / name).stat().st_size, (folder / name).stat().st_mtime_ns]
                      for name in FILES.values()}}


def is_current(entry: pathlib.Path, key: dict) -> bool:
    """Whether ``entry``'s meta.json is ``key``."""
    try:
        return json.loads((entry / "meta.json").read_text()) == key
    except (OSError, ValueError):
        return False

"""Where the data sets live on a machine, and how a failure to read them is said: torch-free.

The loaders (:mod:`mlbench.tasks.data.download` and those that use it) import torch; the data's
identity (:mod:`mlbench.tasks.data.identity`), which the CLI calls, must not. Both take these
from here, so that there is one answer to "where is the data".
"""

from __future__ import annotations

import os
import pathlib

__all__ = ["default_data_root", "one_line"]


def default_data_root() -> pathlib.Path:
    """$MLBENCH_DATA if set, else $XDG_CACHE_HOME/mlbench/data, else ~/.cache/mlbench/data: one
    place, outside the run store, so that data sets are downloaded and converted once per machine,
    not once per run. The XDG Base Directory specification's cache folder is honoured as the run
    store honours $XDG_DATA_HOME; a relative $XDG_CACHE_HOME is ignored, as the specification
    says (it would depend on the folder each command runs in)."""
    env = os.environ.get("MLBENCH_DATA")
    if env:
        return pathlib.Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = pathlib.Path(xdg) if os.path.isabs(xdg) else pathlib.Path.home() / ".cache"
    return base / "mlbench" / "data"


def one_line(exc: BaseException) -> str:
    """The reason an operation failed, as a single line fit for the middle of an error sentence."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text.rstrip(".")

"""Files written whole or not at all, and never through a link planted at their name.

Every file mlbench writes -- at a path its user chose (`download`'s zip and MLPerf log, the
images of `charts`) or in its own folders (run.json, the cluster config, a run's logs) -- is
opened here, so that a symbolic link someone planted at that name (or at the name of its
partial file) is never followed: ``ln -s ~/.bashrc run.zip.part`` must not make `download`
overwrite ``~/.bashrc``.

- :func:`replacing` writes a partial file beside the target, created exclusively and never
  through a link (``O_CREAT | O_EXCL | O_NOFOLLOW``), and renames it over the target when it is
  complete; the rename replaces a link at the target itself, never what it points to. A partial
  file already there (planted, or left by an interrupted write) is refused in one sentence.
- :func:`open_append` opens a log or event file for appending, created with mode 600 when new,
  and refuses a link at its name.

This module sits below every layer (the results, the launchers and the cloud code all use it).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from mlbench.errors import MlbenchError

PART_SUFFIX = ".part"
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


class FileInTheWay(MlbenchError):
    """A partial file (or a link) is already at the name mlbench writes through."""


def part_path(path: str | os.PathLike) -> Path:
    """The partial file of ``path`` (``NAME.part`` beside it)."""
    target = Path(path)
    return target.with_name(target.name + PART_SUFFIX)


@contextlib.contextmanager
def replacing(path: str | os.PathLike, mode: int = 0o666, unique: bool = False) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s new content to; on success it is synced and renamed
    over ``path``, on failure removed (``path`` keeps its old content).

    ``mode`` is the new file's mode (less the umask): 0o666 for what the user asked for, 0o600
    for the store's private files. The partial file is ``NAME.part``; ``unique`` gives it a name
    of its own per call instead, for files that several processes may rewrite at once (run.json).
    """
    target = Path(path)
    tmp = (target.with_name(f"{target.name}.{os.getpid()}-{secrets.token_hex(4)}{PART_SUFFIX}")
           if unique else part_path(target))
    try:
        fd = os.open(tmp, _CREATE, mode)
    except FileExistsError:
        raise FileInTheWay(f"{tmp} already exists (another mlbench writing {target.name}, or one that "
                           "was interrupted); remove it and try again") from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()  # ours: created exclusively above
        raise


def write_bytes(path: str | os.PathLike, data: bytes, mode: int = 0o666, unique: bool = False) -> Path:
    """Write ``data`` to ``path`` through :func:`replacing`; returns ``path``."""
    with replacing(path, mode, unique) as f:
        f.write(data)
    return Path(path)


def write_text(path: str | os.PathLike, text: str, mode: int = 0o666, unique: bool = False) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through :func:`replacing`; returns ``path``."""
    return write_bytes(path, text.encode("utf-8"), mode, unique)


def open_append(path: str | os.PathLike) -> BinaryIO:
    """``path`` opened to append bytes, created with mode 600 when new; a link at ``path`` is
    refused (OSError ELOOP), not followed. Logs and event files of a run use it: they hold
    hyper-parameters, host names and errors, their user's alone as the rest of the store."""
    fd = os.open(path, _APPEND, 0o600)
    return os.fdopen(fd, "ab")

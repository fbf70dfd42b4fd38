"""Files written whole or not at all, and never through a link planted at their name.

Every file mlbench writes -- at a path its user chose (`download`'s zip and MLPerf log, the
images of `charts`) or in its own folders (run.json, the cluster config, a run's logs) -- is
opened here, so that a symbolic link someone planted at that name (or at the name of its
partial file) is never followed: ``ln -s ~/.bashrc run.zip.part`` must not make `download`
overwrite ``~/.bashrc``.

- :func:`replacing` writes a partial file beside the target, created exclusively and never
  through a link (``O_CREAT | O_EXCL | O_NOFOLLOW``), and renames it over the target when it is
  complete; the rename replaces a link at the target itself, never what it points to. The writer
  holds an exclusive lock (``flock``) on its partial file while it writes. A partial file that an
  interrupted writer left (a killed `mlbench download`: a regular file of this user's that no
  process holds locked) is removed and written anew; one that a live writer holds, or a link or
  anything else planted at that name, is refused in one sentence.
- :func:`open_append` opens a log or event file for appending, created with mode 600 when new,
  and refuses a link at its name.

This module sits below every layer (the results, the launchers and the cloud code all use it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import stat
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
        _remove_if_abandoned(tmp, target)
        try:
            fd = os.open(tmp, _CREATE, mode)
        except FileExistsError:  # another writer took the name in between
            raise FileInTheWay(f"{tmp} already exists (another mlbench writing {target.name}); try again "
                               "when it has finished") from None
    fcntl.flock(fd, fcntl.LOCK_EX)   # ours while we write: a later writer leaves it alone
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


def _remove_if_abandoned(tmp: Path, target: Path) -> None:
    """Remove the partial file ``tmp`` if an interrupted writer left it: a regular file of this
    user's with one link that no process holds locked. Else refuse in one sentence: a live
    writer's, or a link or other file planted there, which is never followed or removed."""
    in_the_way = FileInTheWay(f"{tmp} already exists and is not a partial file an interrupted mlbench left "
                              f"(a link, another user's file, or another mlbench writing {target.name}); "
                              "remove it and try again")
    try:
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return   # gone meanwhile: the caller creates it
    except OSError:
        raise in_the_way from None   # a link (ELOOP) or what cannot be opened
    try:
        seen = os.fstat(fd)
        if not stat.S_ISREG(seen.st_mode) or seen.st_nlink != 1 or seen.st_uid != os.getuid():
            raise in_the_way
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FileInTheWay(f"{tmp} is being written by another mlbench writing {target.name}; try again "
                               "when it has finished") from None
        now = os.stat(tmp, follow_symlinks=False)
        if (now.st_ino, now.st_dev) == (seen.st_ino, seen.st_dev):
            os.unlink(tmp)   # the abandoned file itself, still at its name
    finally:
        os.close(fd)


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

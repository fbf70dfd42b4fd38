"""Where data sets live on disk, how they get there, and the form the loaders hand them out in.

Every worker process of a run loads its data set itself, so K processes that start together on a
fresh machine would all find the data missing at once. The first download (and the first LIBSVM
conversion) therefore happens under an exclusive file lock: one process does the work, the others
wait and then find it done. Downloads land under a temporary name and are renamed into place, so a
file that exists under its final name is always complete. Data sets are large (CIFAR-10 170 MB,
epsilon 12 GB), so a download shows its progress (:mod:`mlbench.progress`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import os
import pathlib
import stat
import sys
import tarfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import BinaryIO, NamedTuple

import torch

from mlbench.version import __version__
from mlbench.progress import Progress, fmt_amount
# default_data_root and one_line live in the torch-free paths module (the data's identity reads
# them too); the loaders take them from here
from mlbench.tasks.data.paths import default_data_root as default_data_root
from mlbench.tasks.data.paths import one_line as one_line

#: Exceptions a download or extraction can end with when the network, the server or the disk
#: fails (urllib's errors are OSErrors, a connection cut mid-body an HTTPException; a wrong md5
#: is a RuntimeError).
DOWNLOAD_ERRORS = (OSError, RuntimeError, RecursionError, EOFError, tarfile.TarError,
                   http.client.HTTPException)
#: Bytes read from the network at a time, and seconds a silent connection is given.
CHUNK_BYTES = 1 << 16
TIMEOUT_S = 60


class Split(NamedTuple):
    """One part (train or test) of a data set, whole, as tensors.

    CIFAR-10: x uint8 [N, 3, 32, 32] (C, H, W; RGB), y int64 [N] in 0..9.
    LIBSVM: x float32 [N, d] (sharing the binary cache's memory map), y float32 [N] in {-1, +1}.
    """

    x: torch.Tensor
    y: torch.Tensor


@contextlib.contextmanager
def exclusive(lock_path: pathlib.Path) -> Iterator[None]:
    """Hold an exclusive lock on `lock_path` (created if needed) for the duration of the block.

    flock is released by the kernel when the holder dies, so a crashed download never leaves a
    lock behind that would block the next run (fcntl: Linux and macOS, where workers run).
    """
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


MIRROR_ENV = "MLBENCH_DATA_MIRROR"


def source_url(url: str) -> str:
    """Where to download ``url`` from: itself, or the file of the same name under
    $MLBENCH_DATA_MIRROR (an http(s) URL, e.g. a local mirror of the official files for machines
    or clusters without internet; checksums still apply)."""
    mirror = os.environ.get(MIRROR_ENV)
    return f"{mirror.rstrip('/')}/{url.rsplit('/', 1)[1]}" if mirror else url


def fetch(url: str, dest: pathlib.Path, md5: str | None = None, label: str | None = None, *,
          sha256: str | None = None) -> None:
    """Download `url` to `dest` unless `dest` exists, showing progress as "Downloading LABEL".

    The file's checksum is `md5` or `sha256` (what its publisher states; below, "md5" stands for
    either).

    The bytes go to `dest`.part and are renamed into place only when complete and, given `md5`,
    checked, so a file under the final name is always whole; a download that fails removes its
    part file. The caller holds :func:`exclusive` on the folder's lock (every loader does), so a
    part file found here belongs to no live download: a live one holds the lock and is waited for,
    and the kernel releases the lock of a download killed part-way (SIGKILL, a power cut), whose
    part file stays behind. Such a leftover is continued or replaced, never in the way, with one
    line saying which:

    - continued, as pip's resumable downloads (``--resume-retries``) and ``curl -C -`` do, when
      `md5` is known: a ``Range: bytes=N-`` request for what the N bytes there lack, appended on
      a 206 whose Content-Range starts at N. The final md5 proves the kept bytes a prefix of the
      same file (a server's file may have changed since; no validator was kept for If-Range), so
      without `md5` nothing is resumed. A resumed file whose md5 is wrong is deleted and fetched
      once more from scratch, as torchvision's ``download_url`` re-downloads a file that fails its
      check; a wrong md5 then is the one-line error it always was.
    - replaced (deleted and downloaded anew) otherwise: the server sent the whole file (200,
      where pip starts over; curl would stop and ask, which a worker cannot), or none (416, the
      leftover is not shorter than the file), there is no md5, or the leftover is not a regular
      file of this user's with a single link. Unlinking a planted link removes the link, never
      what it points to, and a continued leftover is opened with ``O_NOFOLLOW`` and checked to be
      the file seen (:mod:`mlbench.safefile`'s rule: nothing is written through a link).
    """
    if dest.is_file():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    name = label or dest.name
    expected, algorithm = (sha256, "sha256") if sha256 is not None else (md5, "md5")
    try:
        resumed, digest = _download(url, part, name, resume=expected is not None, algorithm=algorithm)
        if resumed and digest != expected:
            _say(f"The resumed download of {name} is damaged ({algorithm} {digest}, expected {expected}); "
                 "downloading it anew")
            part.unlink()
            resumed, digest = _download(url, part, name, resume=False, algorithm=algorithm)
        if expected is not None and digest != expected:
            raise RuntimeError(f"the download of {url} is damaged ({algorithm} {digest}, expected {expected})")
        os.replace(part, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            part.unlink()  # ours: created exclusively, or a leftover we opened without following a link
        raise


def _say(line: str) -> None:
    """One line of progress on stderr, where :class:`Progress` writes."""
    print(line, file=sys.stderr, flush=True)


def _download(url: str, part: pathlib.Path, name: str, resume: bool, algorithm: str = "md5") -> tuple[bool, str]:
    """Write `url`'s bytes to `part`, continuing a leftover there when `resume` and the server
    allows; returns whether it was continued and the digest (`algorithm`) of all of `part`."""
    with contextlib.ExitStack() as stack:
        out = _leftover(part, name, resume)
        response = None
        digest = hashlib.new(algorithm, usedforsecurity=False)
        if out is not None:
            stack.enter_context(out)
            while chunk := out.read(CHUNK_BYTES):  # leaves the position at the end, where the rest goes
                digest.update(chunk)
            offset = out.tell()
            response, why_not = _request_rest(url, offset)
            if why_not:
                _say(f"Replacing the leftover {part.name} of an interrupted download of {name} ({why_not})")
                stack.close()
                part.unlink()
                out, digest = None, hashlib.new(algorithm, usedforsecurity=False)
            else:
                _say(f"Resuming the interrupted download of {name} after {fmt_amount(offset, 'B')} "
                     f"({part.name})")
        resumed = out is not None
        if response is None:
            response = urllib.request.urlopen(_request(url), timeout=TIMEOUT_S)
        stack.enter_context(response)
        if out is None:
            out = stack.enter_context(open(part, "xb"))  # O_EXCL: created anew, never through a link
        with Progress(f"Downloading {name}", total=response.length) as progress:
            while chunk := response.read(CHUNK_BYTES):
                out.write(chunk)
                digest.update(chunk)
                progress.advance(len(chunk))
        return resumed, digest.hexdigest()


def _request(url: str, headers: dict[str, str] | None = None) -> urllib.request.Request:
    return urllib.request.Request(url, headers={"User-Agent": f"mlbench/{__version__}", **(headers or {})})


def _request_rest(url: str, offset: int) -> tuple[http.client.HTTPResponse | None, str]:
    """Ask for `url`'s bytes from `offset` on: (the response, "") when it is their 206; else
    (a 200 with the whole file, which the download goes on with, or None) and why it cannot
    continue a leftover."""
    try:
        response = urllib.request.urlopen(_request(url, {"Range": f"bytes={offset}-"}), timeout=TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        if exc.code != 416:
            raise
        exc.close()
        return None, "the server has no bytes after it: it is not shorter than the file"
    if response.status == 200:
        return response, "the server sent the whole file, not its rest"
    if response.status == 206 and (response.headers.get("Content-Range") or "").startswith(f"bytes {offset}-"):
        return response, ""
    response.close()
    return None, f"the server answered {response.status} {response.headers.get('Content-Range') or ''}".rstrip()


def _leftover(part: pathlib.Path, name: str, resume: bool) -> BinaryIO | None:
    """The part file left by a killed download, opened to be continued; None when there is none,
    or when it may not be continued, having then removed it with a line saying why."""
    try:
        seen = os.lstat(part)
    except FileNotFoundError:
        return None
    why_not = ("it is not a regular file" if not stat.S_ISREG(seen.st_mode)
               else "without an md5 its bytes could not be checked" if not resume
               else "it is empty" if seen.st_size == 0 else "")
    if not why_not:
        try:
            fd = os.open(part, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            why_not = f"it cannot be opened: {exc.strerror}"
        else:
            opened = os.fstat(fd)
            if ((opened.st_dev, opened.st_ino) == (seen.st_dev, seen.st_ino) and opened.st_nlink == 1
                    and opened.st_uid == os.geteuid()):
                return os.fdopen(fd, "r+b")
            os.close(fd)
            why_not = "it is not a file of this user's with a single link"
    _say(f"Replacing the leftover {part.name} of an interrupted download of {name} ({why_not})")
    part.unlink()
    return None

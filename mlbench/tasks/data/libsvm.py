"""LIBSVM / svmlight text files (plain or bzip2) as dense float32 arrays, through a binary cache.

epsilon, the data set of task 2a, is 12 GB of text (400,000 x 2,000 training values): parsing it
takes minutes, loading 3.2 GB of float32 takes seconds. So each file is converted once into a
cache entry (x.npy, y.npy, meta.json) and afterwards memory-mapped copy-on-write: the workers of
a run share the page cache instead of holding a private copy each, and a run starts at once.

The file is read in chunks of whole lines (:mod:`mlbench.tasks.data.libsvm_text` parses and
checks them); for .bz2 files the next chunk is decompressed in a thread (bz2 releases the GIL)
while the current one is parsed.
"""

from __future__ import annotations

import bz2
import contextlib
import json
import logging
import os
import pathlib
import shutil
import struct
import tempfile
import time
from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor
from typing import IO

import numpy as np
import torch

from mlbench.errors import DataError
from mlbench.progress import Progress
from mlbench.tasks.data.download import DOWNLOAD_ERRORS, Split, exclusive, fetch, one_line, source_url
from mlbench.tasks.data.libsvm_layout import (STEMS, cache_entry, cache_key, default_cache_root, default_folder,
                                              find_pair, is_current, pick_pair)
from mlbench.tasks.data.libsvm_text import Parsed, check_width, cut_off, parse_fast, parse_lines, validate

__all__ = ["EPSILON_BASE_URL", "EPSILON_FILES", "find_pair", "load_libsvm_dataset", "read_libsvm"]

log = logging.getLogger(__name__)

EPSILON_BASE_URL = "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary/"
EPSILON_FILES = ("epsilon_normalized.bz2", "epsilon_normalized.t.bz2")

CHUNK_BYTES = 1 << 24
#: 2: values beyond float32, repeated or unsorted indices and a missing final newline are refused
#: (an entry converted by the laxer version 1 is converted, and so checked, again)
_CACHE_VERSION = 2
_HEADER_BYTES = 128  # x.npy's header is reserved up front and written once the shape is known


def read_libsvm(
    path: str | os.PathLike,
    n_features: int | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Dense float32 features [N, d] and float32 labels [N] in {-1, +1} of one LIBSVM file.

    d is `n_features` when given (a larger index is an error), else the largest feature index in
    the file. Labels 0/1 and -1/+1 both map to -1/+1. The arrays come from the cache entry for
    (absolute path, size, mtime, n_features) under `cache_dir` (default
    default_data_root()/libsvm-cache), which is built on first use and rebuilt when the file
    changes; x is a copy-on-write memory map of it.
    """
    if n_features is not None and n_features < 1:
        raise ValueError(f"n_features must be positive, not {n_features}")
    source = pathlib.Path(path).expanduser().resolve()
    try:
        stat = source.stat()
    except OSError as exc:
        raise DataError(f"cannot read the LIBSVM file {source} ({one_line(exc)}); check the path") from None
    cache_root = pathlib.Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    key = {**cache_key(source, stat.st_size, stat.st_mtime_ns, n_features), "version": _CACHE_VERSION}
    entry = cache_entry(cache_root, source, n_features)
    if not is_current(entry, key):
        try:
            with exclusive(cache_root / f".{entry.name}.lock"):
                if not is_current(entry, key):  # another worker may have built it meanwhile
                    _build_entry(source, n_features, entry, key)
        except OSError as exc:  # reading errors are DataErrors already: this is the cache's disk
            raise DataError(
                f"could not write the binary cache for {source} in {cache_root} ({one_line(exc)}); "
                "free disk space there or set MLBENCH_DATA to another folder"
            ) from None
    try:
        return np.load(entry / "x.npy", mmap_mode="c"), np.load(entry / "y.npy")
    except (OSError, ValueError) as exc:
        raise DataError(f"the binary cache {entry} is unreadable ({one_line(exc)}); delete that folder") from None


def load_libsvm_dataset(
    data_dir: str | os.PathLike | None = None,
    name: str = "epsilon",
    download: bool = True,
) -> tuple[Split, Split]:
    """(train, test) of a LIBSVM data set as tensors; x shares the cache's memory map.

    `data_dir` holds the pair F / F.t (each optionally .bz2), see find_pair. With `data_dir` None
    the pair lives in default_data_root()/name, where epsilon is downloaded from the LIBSVM site
    on first use when `download` is true. Train and test get the same width d, the largest
    feature index in either file (a file narrower than d gets its own cache entry of width d).
    """
    folder = pathlib.Path(data_dir).expanduser() if data_dir is not None else default_folder(name)
    if data_dir is None and name == "epsilon" and download and pick_pair(folder, STEMS[name]) is None:
        _download_epsilon(folder)
    paths = find_pair(folder, name)
    arrays = [read_libsvm(p) for p in paths]
    d = max(x.shape[1] for x, _ in arrays)
    arrays = [read_libsvm(p, n_features=d) if x.shape[1] < d else (x, y) for p, (x, y) in zip(paths, arrays)]
    (x_train, y_train), (x_test, y_test) = arrays
    return (
        Split(torch.from_numpy(x_train), torch.from_numpy(y_train)),
        Split(torch.from_numpy(x_test), torch.from_numpy(y_test)),
    )


def _download_epsilon(folder: pathlib.Path) -> None:
    with exclusive(folder / ".lock"):
        try:
            for name in EPSILON_FILES:
                fetch(source_url(EPSILON_BASE_URL + name), folder / name, label=f"epsilon {name}")
        except DOWNLOAD_ERRORS as exc:
            raise DataError(
                f"could not download epsilon ({one_line(exc)}); put {' and '.join(EPSILON_FILES)} (or their "
                f"decompressed versions) from {EPSILON_BASE_URL} in {folder} or pass --data-dir DIR"
            ) from None


# --- the cache -----------------------------------------------------------------------------


def _build_entry(source: pathlib.Path, n_features: int | None, entry: pathlib.Path, key: dict) -> None:
    """Convert `source` into a staging folder and rename it to `entry` once complete.

    Runs under the entry's lock, so staging folders left by an interrupted conversion of the same
    entry can be removed, and an outdated entry replaced (a process still mapping its files keeps
    reading them: unlinking does not take them away on POSIX).
    """
    cache_root = entry.parent
    for leftover in cache_root.glob(".tmp-*"):
        if leftover.name.startswith(f".tmp-{entry.name}-"):
            shutil.rmtree(leftover, ignore_errors=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".tmp-{entry.name}-", dir=cache_root))
    try:
        log.info("converting %s to a binary cache in %s (once)", source, entry)
        started = time.monotonic()
        rows, cols = _convert(source, n_features, staging)
        (staging / "meta.json").write_text(json.dumps({**key, "rows": rows, "cols": cols}))
        if entry.exists():
            os.rename(entry, staging.with_name(staging.name + "-old"))
        os.rename(staging, entry)
        log.info("converted %s: %d x %d in %.1f s", source.name, rows, cols, time.monotonic() - started)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(staging.with_name(staging.name + "-old"), ignore_errors=True)


def _convert(source: pathlib.Path, n_features: int | None, out: pathlib.Path) -> tuple[int, int]:
    """Write out/x.npy and out/y.npy from the text file; returns (rows, columns)."""
    labels = []
    line = 1
    text_bytes = 0
    stream, raw = _open_source(source)
    with _DenseWriter(out / "x.npy", n_features) as writer:
        with raw, stream, contextlib.closing(_chunks(stream, source)) as chunks, \
                Progress(f"Converting {source.name}", total=os.fstat(raw.fileno()).st_size) as progress:
            for chunk, whole in chunks:
                if not whole:
                    raise cut_off(source, line)
                parsed = parse_fast(chunk) or parse_lines(chunk, source, line)
                validate(parsed, source, line, n_features)
                text_bytes += len(chunk)
                check_width(parsed, source, line, writer.rows, writer.width, text_bytes)
                labels.append(np.where(parsed.labels > 0, 1.0, -1.0).astype(np.float32))
                writer.add(parsed)
                line += chunk.count(b"\n")
                progress.update(raw.tell(), note=f"{line - 1:,} lines")
        if writer.rows == 0:
            raise DataError(f"{source} holds no data lines; give a file in LIBSVM format "
                            "('<label> <index>:<value> ...')")
        writer.finish()
    np.save(out / "y.npy", np.concatenate(labels))
    return writer.rows, writer.width


def _open_source(source: pathlib.Path) -> tuple[IO[bytes], IO[bytes]]:
    """The file's bytes, decompressed when it starts with bzip2's magic (whatever its name), and
    the file itself, whose position tells how much of it was read (the conversion's progress)."""
    try:
        raw = open(source, "rb")  # noqa: SIM115 - returned to the caller, who closes it
        compressed = raw.read(3) == b"BZh"
        raw.seek(0)
        return (bz2.BZ2File(raw) if compressed else raw), raw
    except OSError as exc:
        raise DataError(f"cannot read the LIBSVM file {source} ({one_line(exc)}); check its permissions") from None


def _chunks(stream: IO[bytes], source: pathlib.Path) -> Generator[tuple[bytes, bool], None, None]:
    """(lines, whole): whole lines, about CHUNK_BYTES at a time, each ending with a newline; the
    next block is read (and decompressed) in a thread while the caller parses the current one.
    A last line without its line end (unless it is blank) comes alone, with whole False: the
    caller refuses the file, since that line may have been cut anywhere."""
    carry = b""
    with ThreadPoolExecutor(max_workers=1) as reader:
        pending = reader.submit(stream.read, CHUNK_BYTES)
        while True:
            try:
                block = pending.result()
            except (OSError, EOFError) as exc:
                raise DataError(
                    f"cannot read {source} ({one_line(exc)}); the file is damaged or truncated, download it again"
                ) from None
            if not block:
                break
            pending = reader.submit(stream.read, CHUNK_BYTES)
            block = carry + block
            cut = block.rfind(b"\n") + 1
            carry = block[cut:]
            if cut:
                yield block[:cut], True
    if carry.strip():
        yield carry, False


class _DenseWriter:
    """Appends dense float32 row blocks to an .npy file whose header is written at the end.

    With n_features unknown, a block is as wide as the widest line seen so far; when the width
    grew after the first block (sparse files), finish() re-lays the blocks out at the final
    width. Dense files such as epsilon reach their full width in the first block, so their
    rows are written exactly once.
    """

    def __init__(self, path: pathlib.Path, n_features: int | None) -> None:
        self.path = path
        self.width = n_features or 0
        self.rows = 0
        self.blocks: list[tuple[int, int]] = []  # (rows, width) of each block, in file order
        self.handle = open(path, "wb")  # noqa: SIM115 - closed by finish() / __exit__
        self.handle.write(b"\0" * _HEADER_BYTES)

    def __enter__(self) -> _DenseWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.handle.close()

    def add(self, parsed: Parsed) -> None:
        if not parsed.labels.size:
            return
        columns = parsed.indices.astype(np.int64) - 1
        if columns.size:
            self.width = max(self.width, int(columns.max()) + 1)
        block = np.zeros((parsed.labels.size, self.width), dtype=np.float32)
        block[parsed.pair_row, columns] = parsed.value
        block.tofile(self.handle)
        self.blocks.append(block.shape)
        self.rows += block.shape[0]

    def finish(self) -> None:
        self.handle.close()
        if all(width == self.width for _, width in self.blocks):
            with open(self.path, "r+b") as handle:
                handle.write(_npy_header((self.rows, self.width)))
            return
        narrow = self.path.with_name(self.path.name + ".blocks")
        os.replace(self.path, narrow)
        out = np.lib.format.open_memmap(self.path, mode="w+", dtype=np.float32, shape=(self.rows, self.width))
        offset, row = _HEADER_BYTES, 0
        for rows, width in self.blocks:
            out[row : row + rows, :width] = np.memmap(narrow, np.float32, "r", offset, (rows, width))
            offset += rows * width * 4
            row += rows
        out.flush()
        del out
        narrow.unlink()


def _npy_header(shape: tuple[int, int]) -> bytes:
    """An .npy (version 1.0) header of exactly _HEADER_BYTES for a C-order float32 array."""
    text = repr({"descr": "<f4", "fortran_order": False, "shape": tuple(int(n) for n in shape)}).encode("latin1")
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", _HEADER_BYTES - 10) + text.ljust(_HEADER_BYTES - 11) + b"\n"

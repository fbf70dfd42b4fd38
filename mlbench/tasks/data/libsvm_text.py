"""Parsing LIBSVM / svmlight text, a chunk of whole lines at a time, and checking what it says.

A handful of numpy passes check the structure of every line of a chunk ('<label> <index>:<value>
...') and np.fromstring turns all its numbers into floats in C. A chunk that fails the check (or
holds comments or qid tokens) is parsed again line by line in Python, which either accepts it or
names the offending line.

Two checks protect against damaged or hostile files before anything large is written:

- A file whose last line has no line end was most likely cut off (an interrupted download or
  copy; the torn row would silently get zeros or a shortened last value). It is refused, naming
  the line: even a line with all the features of the one before it may have lost digits of its
  last value ('1:5 2:6' of '1:5 2:6.25'), so only the line end tells that a line is complete.
- The cache is dense, N x d float32, so a single large index makes it huge: "1 100000000:1"
  would be 400 MB. A width is refused (one line, naming the line of the index) once the array it
  implies exceeds :data:`DENSE_BYTES_PER_TEXT_BYTE` times the text read so far, or
  :data:`DENSE_FLOOR_BYTES` for small files. Real data sets are far below it (epsilon: 0.27 bytes
  of array per byte of text; a9a: about 7); a file that sparse needs its features renumbered.
"""

from __future__ import annotations

import pathlib
from typing import NamedTuple

import numpy as np

from mlbench.errors import DataError

DENSE_BYTES_PER_TEXT_BYTE = 64
DENSE_FLOOR_BYTES = 256 << 20
MAX_INDEX = 2**31 - 1
#: The smallest magnitude that float32 (the cache's type) rounds to inf: halfway between its
#: largest finite value (2**128 - 2**104) and 2**128, a tie that rounds to even, i.e. up.
FLOAT32_OVERFLOW = 2.0**128 - 2.0**103
_SPACE = np.zeros(256, dtype=bool)
_SPACE[list(b" \t\n\v\f\r")] = True
_COLON = ord(":")


class Parsed(NamedTuple):
    labels: np.ndarray  # float64 [m], one per data line of the chunk
    pair_row: np.ndarray  # int64 [p], the data line (0..m-1) each index:value pair belongs to
    indices: np.ndarray  # float64 [p], feature indices as written (validated later)
    value: np.ndarray  # float64 [p]
    line_offset: np.ndarray  # int64 [m], each data line's line number minus the chunk's first


def parse_fast(chunk: bytes) -> Parsed | None:
    """Parse a chunk with whole-chunk numpy operations; None when any line does not have the
    plain form '<label> <index>:<value> ...' (the caller then parses line by line)."""
    if b"#" in chunk or b"qid" in chunk:
        return None
    buf = np.frombuffer(chunk, dtype=np.uint8)
    space = _SPACE[buf]
    is_colon = buf == _COLON
    words = np.flatnonzero(~space & np.concatenate(([True], space[:-1])))  # first byte of each word
    colons = np.flatnonzero(is_colon)
    line_end = np.flatnonzero(buf == ord("\n"))
    line_start = np.concatenate(([0], line_end[:-1] + 1))
    # A colon joins exactly two non-blank characters, and a word holds at most one colon.
    if colons.size:
        if colons[0] == 0:
            return None
        before, after = buf[colons - 1], buf[colons + 1]
        if (_SPACE[before] | (before == _COLON) | _SPACE[after] | (after == _COLON)).any():
            return None
    colon_word = np.searchsorted(words, colons, side="right") - 1
    if (np.diff(colon_word) == 0).any():
        return None
    # The first word of a line (the label) holds no colon; every other word holds one.
    first_word = np.searchsorted(words, line_start)
    if (colon_word == first_word[np.searchsorted(line_end, colons)]).any():
        return None
    words_per_line = np.diff(np.searchsorted(words, line_end), prepend=0)
    colons_per_line = np.diff(np.searchsorted(colons, line_end), prepend=0)
    data_line = words_per_line > 0
    if (words_per_line[data_line] != colons_per_line[data_line] + 1).any():
        return None
    try:
        numbers = np.fromstring(chunk.replace(b":", b" "), sep=" ")
    except ValueError:  # a token that is not a number
        return None
    if numbers.size != words.size + colons.size:
        return None
    pairs_per_line = colons_per_line[data_line]
    numbers_per_line = 1 + 2 * pairs_per_line
    label_at = np.cumsum(numbers_per_line) - numbers_per_line
    is_pair = np.ones(numbers.size, dtype=bool)
    is_pair[label_at] = False
    pairs = numbers[is_pair].reshape(-1, 2)
    return Parsed(
        labels=numbers[label_at],
        pair_row=np.repeat(np.arange(pairs_per_line.size), pairs_per_line),
        indices=pairs[:, 0],
        value=pairs[:, 1],
        line_offset=np.flatnonzero(data_line),
    )


def parse_lines(chunk: bytes, source: pathlib.Path, first_line: int) -> Parsed:
    """The reference parser, line by line: accepts '#' comments and ignores qid:N tokens (the
    svmlight extensions), and raises DataError naming the first line that is not LIBSVM."""
    labels: list[float] = []
    rows: list[int] = []
    pairs: list[tuple[float, float]] = []
    offsets: list[int] = []
    for offset, line in enumerate(chunk.split(b"\n")[:-1]):
        tokens = line.split(b"#", 1)[0].split()
        if not tokens:
            continue
        try:
            label = float(tokens[0])
            line_pairs = []
            for token in tokens[1:]:
                if token.startswith(b"qid:"):
                    continue
                index, value = token.split(b":")
                line_pairs.append((float(index), float(value)))
        except ValueError:
            text = line.decode("utf-8", "replace").strip()
            raise DataError(
                f"{source}, line {first_line + offset} is not in LIBSVM format ('<label> <index>:<value> ...'): "
                f"{text[:60]!r}{'...' if len(text) > 60 else ''}; fix or remove that line"
            ) from None
        rows.extend([len(labels)] * len(line_pairs))
        pairs.extend(line_pairs)
        labels.append(label)
        offsets.append(offset)
    pair_array = np.array(pairs, dtype=np.float64).reshape(-1, 2)
    return Parsed(
        labels=np.array(labels, dtype=np.float64),
        pair_row=np.array(rows, dtype=np.int64),
        indices=pair_array[:, 0],
        value=pair_array[:, 1],
        line_offset=np.array(offsets, dtype=np.int64),
    )


def validate(parsed: Parsed, source: pathlib.Path, first_line: int, n_features: int | None) -> None:
    """Check what both parsers leave open: binary labels, positive integer indices within
    n_features in strictly ascending order on each line (the LIBSVM format; a repeated index
    would silently keep only one of its values), and values that stay finite as float32 (the
    cache's type: '1e40' is finite text that would train on inf). The DataError names the
    first offending line."""

    def fail(row: int, problem: str) -> None:
        raise DataError(f"{source}, line {first_line + int(parsed.line_offset[row])}: {problem}")

    bad = np.flatnonzero(~np.isin(parsed.labels, (-1.0, 0.0, 1.0)))
    if bad.size:
        fail(bad[0], f"label {parsed.labels[bad[0]]:g} is not binary; mlbench reads labels 0/1 or -1/+1")
    index = parsed.indices
    limit = n_features if n_features is not None else MAX_INDEX
    bad = np.flatnonzero((index < 1) | (index > limit) | (index != np.floor(index)))
    if bad.size:
        value = index[bad[0]]
        if n_features is not None and value > n_features and value == np.floor(value):
            fail(parsed.pair_row[bad[0]], f"feature index {value:g} exceeds n_features={n_features}; raise n_features")
        fail(parsed.pair_row[bad[0]], f"feature index {value:g} is not an integer in 1..{limit}; fix that line")
    bad = np.flatnonzero((parsed.pair_row[1:] == parsed.pair_row[:-1]) & (index[1:] <= index[:-1]))
    if bad.size:
        before, after = index[bad[0]], index[bad[0] + 1]
        problem = (f"feature index {after:g} appears twice" if after == before
                   else f"feature index {after:g} follows index {before:g}")
        fail(parsed.pair_row[bad[0] + 1], f"{problem}; LIBSVM lists each index once, in ascending order")
    bad = np.flatnonzero(~(np.abs(parsed.value) < FLOAT32_OVERFLOW))  # nan compares false
    if bad.size:
        value = parsed.value[bad[0]]
        problem = ("is not a finite number" if not np.isfinite(value)
                   else "is beyond float32's range (about 3.4e38), where mlbench's data would be infinite")
        fail(parsed.pair_row[bad[0]], f"value {value:g} {problem}; fix that line")


def cut_off(source: pathlib.Path, line: int) -> DataError:
    """The error for a last line without a line end that is not clearly complete."""
    return DataError(
        f"{source}, line {line}: the file ends in the middle of this line (it has no line end), so it "
        "looks cut off (an interrupted download or copy); download it again, or end the file with a "
        "newline if that line is complete"
    )


def check_width(parsed: Parsed, source: pathlib.Path, first_line: int, rows_before: int, width_before: int,
                text_bytes: int) -> None:
    """Refuse a width that the text read so far cannot justify (see the module), before the
    dense block for it is allocated."""
    if not parsed.indices.size:
        return
    widest = int(np.argmax(parsed.indices))
    width = max(width_before, int(parsed.indices[widest]))
    rows = rows_before + parsed.labels.size
    dense = rows * width * 4
    if dense > max(DENSE_FLOOR_BYTES, DENSE_BYTES_PER_TEXT_BYTE * text_bytes):
        row = parsed.pair_row[widest]
        raise DataError(
            f"{source}, line {first_line + int(parsed.line_offset[row])}: feature index "
            f"{parsed.indices[widest]:.0f} would make the data {rows} x {width} float32 ({dense / 2**20:,.0f} MiB) "
            f"from {text_bytes:,} bytes of text; mlbench keeps LIBSVM data dense and accepts at most "
            f"{DENSE_BYTES_PER_TEXT_BYTE} bytes per byte of text (or {DENSE_FLOOR_BYTES >> 20} MiB), so check "
            "that index or renumber the features 1..d"
        )

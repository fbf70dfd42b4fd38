"""Byte offsets that readers send (the dashboard's event cursor ``since=RANK:OFFSET`` and
``logs/NAME?offset=N``, the results service's ``file?offset=N``): parsed alike by both servers,
and read from without asking the file system for a position it cannot give.

A file system refuses to seek past its largest file (ext4: 16 TiB; ``lseek`` fails with EINVAL
or EFBIG), and Python refuses an offset beyond a signed 64-bit ``off_t`` outright, so an offset
is parsed as ASCII digits up to :data:`MAX_OFFSET` (else a one-line :class:`UsageError`, which
both servers answer with 400) and never passed to ``seek`` beyond the file's end.

An offset past the file's end is clamped to the end, not refused: it reads nothing, and the
answer's next offset is where the file ends (for events, the end of its last whole line). A
reader's offset can be past the end without any mistake of the reader's: the results service
cuts a torn last line when it restarts, and a log can be written anew, both after the offset
was handed out. Refusing it would leave such a reader stuck on a 400 it cannot avoid; clamped,
it goes on from where the file now ends, as it would from an offset it was given just now.
"""

from __future__ import annotations

import os
import re
from typing import BinaryIO

from mlbench.errors import UsageError

#: The largest byte offset a file can be read from (a signed 64-bit off_t).
MAX_OFFSET = 2**63 - 1
_DIGITS = re.compile(r"[0-9]{1,19}")   # ASCII only: str.isdigit would take '²'
_BLOCK = 64 * 1024


def parse_offset(text: str, what: str) -> int:
    """A byte offset in a query (ASCII digits, at most MAX_OFFSET), else a one-line UsageError
    that starts with ``what`` (the query as the reader sent it)."""
    if not _DIGITS.fullmatch(text) or int(text) > MAX_OFFSET:
        raise UsageError(f"{what}: expected a byte offset, a whole number from 0 to {MAX_OFFSET}")
    return int(text)


def seek_within(f: BinaryIO, offset: int) -> None:
    """Seek ``f`` to ``offset``, or to its end when the offset is past it."""
    f.seek(min(max(0, offset), os.fstat(f.fileno()).st_size))


def whole_lines_within(path: str | os.PathLike, offset: int) -> int:
    """``offset`` when it is within the file at ``path``; past its end, the end of the file's
    last whole line (0 when it has none or is gone): a cursor of whole lines stays one, so the
    next read does not start inside a line still being written."""
    try:
        with open(path, "rb") as f:
            end = os.fstat(f.fileno()).st_size
            if offset <= end:
                return offset
            while end > 0:
                start = max(0, end - _BLOCK)
                f.seek(start)
                newline = f.read(end - start).rfind(b"\n")
                if newline >= 0:
                    return start + newline + 1
                end = start
    except FileNotFoundError:
        pass
    return 0

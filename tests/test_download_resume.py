"""A download killed part-way leaves DEST.part behind; the next download continues it (a Range
request, when the server answers 206 and the md5 proves the kept bytes a prefix) or replaces it,
saying which in one line, and never writes through a link planted at that name.

Every test runs `fetch` against a real HTTP server on 127.0.0.1 whose handler answers Range
requests itself (or, in the variant without, sends the whole file) and logs the Range header of
each request it gets, so what was asked for is read from the server's own log.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mlbench.tasks.data.download import CHUNK_BYTES, exclusive, fetch

REPO = Path(__file__).resolve().parents[1]
BODY = random.Random(57).randbytes(5 * CHUNK_BYTES + 123)
MD5 = hashlib.md5(BODY).hexdigest()
PREFIX = 2 * CHUNK_BYTES  # what a killed download had written: two whole chunks


class FileServer:
    """Serves BODY at /data.bin; `log` holds each request's Range header (None without one)."""

    def __init__(self, ranges: bool):
        self.ranges = ranges
        self.log: list[str | None] = []
        self.stall_after: int | None = None  # send this many bytes, then hang until released
        self.release = threading.Event()
        files = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                asked = self.headers.get("Range")
                files.log.append(asked)
                match = re.fullmatch(r"bytes=(\d+)-", asked or "") if files.ranges else None
                start = int(match.group(1)) if match else 0
                if start >= len(BODY):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(BODY)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206 if match else 200)
                if match:
                    self.send_header("Content-Range", f"bytes {start}-{len(BODY) - 1}/{len(BODY)}")
                self.send_header("Content-Length", str(len(BODY) - start))
                self.end_headers()
                if files.stall_after is not None:
                    self.wfile.write(BODY[start:files.stall_after])
                    self.wfile.flush()
                    files.release.wait(60)
                    return
                self.wfile.write(BODY[start:])

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/data.bin"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def server():
    files = FileServer(ranges=True)
    yield files
    files.close()


@pytest.fixture
def server_without_ranges():
    files = FileServer(ranges=False)
    yield files
    files.close()


@pytest.fixture
def dest(tmp_path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    return folder / "data.bin"


def part_of(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


def lines(capsys) -> list[str]:
    return capsys.readouterr().err.splitlines()


def write_body(folder: Path) -> Path:
    path = folder / "body"
    path.write_bytes(BODY)
    return path


def test_a_leftover_prefix_is_resumed_with_a_range_request(server, dest, capsys):
    part_of(dest).write_bytes(BODY[:PREFIX])
    fetch(server.url, dest, md5=MD5, label="the data")
    assert dest.read_bytes() == BODY
    assert not part_of(dest).exists()
    assert server.log == [f"bytes={PREFIX}-"]  # only the rest was asked for
    assert lines(capsys) == ["Resuming the interrupted download of the data after 131.1 kB (data.bin.part)"]


def test_without_range_support_the_leftover_is_replaced(server_without_ranges, dest, capsys):
    part_of(dest).write_bytes(BODY[:PREFIX])
    fetch(server_without_ranges.url, dest, md5=MD5, label="the data")
    assert dest.read_bytes() == BODY
    assert server_without_ranges.log == [f"bytes={PREFIX}-"]  # asked, and sent the whole file: one request
    assert lines(capsys) == ["Replacing the leftover data.bin.part of an interrupted download of the data "
                             "(the server sent the whole file, not its rest)"]


def test_a_leftover_that_is_no_prefix_fails_its_md5_once_then_is_downloaded_anew(server, dest, capsys):
    garbage = random.Random(8).randbytes(PREFIX)
    part_of(dest).write_bytes(garbage)
    fetch(server.url, dest, md5=MD5, label="the data")
    assert dest.read_bytes() == BODY
    assert server.log == [f"bytes={PREFIX}-", None]  # resumed, then once from scratch
    said = lines(capsys)
    assert len(said) == 2 and said[0].startswith("Resuming the interrupted download of the data")
    wrong = hashlib.md5(garbage + BODY[PREFIX:]).hexdigest()
    assert said[1] == (f"The resumed download of the data is damaged (md5 {wrong}, expected {MD5}); "
                       "downloading it anew")


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_a_link_planted_as_the_part_file_is_not_written_through(server, dest, tmp_path, capsys, link):
    outside = tmp_path / "outside"
    outside.write_bytes(BODY[:PREFIX])  # a prefix: following the link would resume into it
    if link == "symlink":
        part_of(dest).symlink_to(outside)
    else:
        os.link(outside, part_of(dest))
    fetch(server.url, dest, md5=MD5, label="the data")
    assert outside.read_bytes() == BODY[:PREFIX]
    assert not outside.is_symlink() and outside.stat().st_nlink == 1
    assert dest.read_bytes() == BODY and not dest.is_symlink()
    assert server.log == [None]  # downloaded anew, nothing resumed through the link
    reason = "it is not a regular file" if link == "symlink" else "it is not a file of this user's with a single link"
    assert lines(capsys) == [f"Replacing the leftover data.bin.part of an interrupted download of the data ({reason})"]


def test_a_download_killed_part_way_is_resumed_by_the_next(server, dest):
    """SIGKILL of a real download (a process of its own, holding the folder's lock as the loaders
    do) part-way; the next download neither waits for it nor is refused, and asks only for the rest."""
    server.stall_after = PREFIX
    child = subprocess.Popen(
        [sys.executable, "-c", "import pathlib, sys\n"
         "from mlbench.tasks.data.download import exclusive, fetch\n"
         "dest = pathlib.Path(sys.argv[2])\n"
         "with exclusive(dest.parent / '.lock'):\n"
         "    fetch(sys.argv[1], dest, md5=sys.argv[3])\n", server.url, str(dest), MD5],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (part_of(dest).exists() and part_of(dest).stat().st_size == PREFIX):
            assert child.poll() is None and time.monotonic() < deadline, "the download never got under way"
            time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    server.stall_after = None
    server.release.set()
    with exclusive(dest.parent / ".lock"):
        fetch(server.url, dest, md5=MD5)
    assert dest.read_bytes() == BODY
    assert server.log == [None, f"bytes={PREFIX}-"]


def test_the_part_file_of_a_live_download_is_left_alone(server, dest):
    """A download that holds the lock is waited for; its part file is neither resumed nor
    replaced, and the file it renames into place is taken as it is."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         "lock, part, dest, body = sys.argv[1:]\n"
         "with open(lock, 'a+b') as held:\n"
         "    fcntl.flock(held, fcntl.LOCK_EX)\n"
         "    data = open(body, 'rb').read()\n"
         "    open(part, 'wb').write(data[:100])\n"
         "    print('writing', flush=True)\n"
         "    time.sleep(1)\n"
         "    open(part, 'wb').write(data)\n"
         "    os.replace(part, dest)\n",
         str(dest.parent / ".lock"), str(part_of(dest)), str(dest), str(write_body(dest.parent.parent))],
        stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "writing\n"
        with exclusive(dest.parent / ".lock"):
            fetch(server.url, dest, md5=MD5)
    finally:
        child.wait(30)
    assert child.returncode == 0
    assert dest.read_bytes() == BODY
    assert server.log == []


def test_a_leftover_no_shorter_than_the_file_is_replaced(server, dest, capsys):
    part_of(dest).write_bytes(BODY + b"more")
    fetch(server.url, dest, md5=MD5, label="the data")
    assert dest.read_bytes() == BODY
    assert server.log == [f"bytes={len(BODY) + 4}-", None]  # 416, then the whole file
    assert lines(capsys) == ["Replacing the leftover data.bin.part of an interrupted download of the data "
                             "(the server has no bytes after it: it is not shorter than the file)"]


def test_without_an_md5_a_leftover_is_replaced_not_resumed(server, dest, capsys):
    part_of(dest).write_bytes(BODY[:PREFIX])
    fetch(server.url, dest, label="the data")
    assert dest.read_bytes() == BODY
    assert server.log == [None]
    assert lines(capsys) == ["Replacing the leftover data.bin.part of an interrupted download of the data "
                             "(without an md5 its bytes could not be checked)"]


def test_a_wrong_md5_after_the_fresh_attempt_is_one_line_and_leaves_nothing(server, dest):
    part_of(dest).write_bytes(BODY[:PREFIX])
    with pytest.raises(RuntimeError) as err:
        fetch(server.url, dest, md5="0" * 32)
    assert str(err.value) == f"the download of {server.url} is damaged (md5 {MD5}, expected {'0' * 32})"
    assert server.log == [f"bytes={PREFIX}-", None]  # one fresh attempt, no more
    assert sorted(p.name for p in dest.parent.iterdir()) == []

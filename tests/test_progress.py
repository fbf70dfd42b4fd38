"""Progress of long work: lines every few seconds off a terminal, a redrawn bar on one."""

from __future__ import annotations

import hashlib
import http.server
import io
import re
import threading
import time

import numpy as np
import pytest

from mlbench import progress
from mlbench.progress import Progress, StatusLines
from mlbench.tasks.data import download, libsvm
from tests.conftest import write_libsvm

SIZE = 4_200_000
PIECE = 1 << 16


@pytest.fixture
def slow_server():
    """An HTTP server on 127.0.0.1 that sends a 4.2 MB file in 64 KiB pieces, 1 s in all."""
    payload = np.random.default_rng(0).integers(0, 256, SIZE, dtype=np.uint8).tobytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(SIZE))
            self.end_headers()
            pieces = range(0, SIZE, PIECE)
            for start in pieces:
                self.wfile.write(payload[start:start + PIECE])
                time.sleep(1.0 / len(pieces))

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/data.bin", payload
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def fast_lines(monkeypatch):
    """Progress lines from the start and every 0.1 s (instead of after 1 s, every 5 s)."""
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    monkeypatch.setattr(progress, "INTERVAL_S", 0.1)


# a line comes with a piece that arrives at least INTERVAL_S after the last line; with the last
# piece it says no time left ("4.2 MB of 4.2 MB (100%), 3.8 MB/s": the loaded CI box once)
_LINE = re.compile(r"^Downloading data\.bin: ([\d.]+) ([kM])B of 4\.2 MB \((\d+)%\), [\d.]+ [kM]B/s"
                   r"(?P<left>, \d:\d\d:\d\d left)?$")


def test_download_prints_progress_lines_when_not_on_a_terminal(slow_server, fast_lines, tmp_path, capsys):
    url, payload = slow_server
    dest = tmp_path / "data.bin"
    download.fetch(url, dest, md5=hashlib.md5(payload).hexdigest())
    assert dest.read_bytes() == payload and not (tmp_path / "data.bin.part").exists()
    lines = capsys.readouterr().err.splitlines()
    assert "\r" not in "".join(lines)
    matches = [m for m in map(_LINE.match, lines[:-1]) if m]
    assert len(matches) == len(lines) - 1, lines
    amounts = [float(m.group(1)) * {"k": 1e3, "M": 1e6}[m.group(2)] for m in matches]
    assert all(m["left"] or m.group(3) == "100" for m in matches), lines   # (99.6% shows as 100% too)
    assert len([a for a in amounts if a < SIZE]) >= 3, lines
    assert amounts == sorted(amounts) and amounts[0] < amounts[-1] <= SIZE
    assert re.match(r"^Downloading data\.bin: 4\.2 MB in 0:00:\d\d \([\d.]+ MB/s\)$", lines[-1]), lines[-1]


def test_a_damaged_download_leaves_no_file(slow_server, tmp_path):
    url, _ = slow_server
    with pytest.raises(RuntimeError, match=r"is damaged \(md5 [0-9a-f]{32}, expected 0{32}\)"):
        download.fetch(url, tmp_path / "data.bin", md5="0" * 32)
    assert list(tmp_path.iterdir()) == []


def test_quick_work_shows_nothing(slow_server, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(progress, "DELAY_S", 60.0)
    download.fetch(slow_server[0], tmp_path / "data.bin")
    assert capsys.readouterr().err == ""


def test_libsvm_conversion_reports_bytes_and_lines(fast_lines, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(progress, "INTERVAL_S", 0.0)  # a line per chunk of 16 KiB
    monkeypatch.setattr(libsvm, "CHUNK_BYTES", 1 << 14)
    rng = np.random.default_rng(1)
    source = write_libsvm(tmp_path / "rows", rng.normal(size=(3000, 20)), rng.choice([-1, 1], 3000))
    x, _ = libsvm.read_libsvm(source, cache_dir=tmp_path / "cache")
    assert x.shape == (3000, 20)
    lines = capsys.readouterr().err.splitlines()
    counts = [int(m.group(1).replace(",", "")) for m in
              (re.match(r"^Converting rows: [\d.]+ [kM]B of [\d.]+ [kM]B \(\d+%\), .*?([\d,]+) lines$", line)
               for line in lines[:-1]) if m]
    assert len(counts) >= 3 and counts == sorted(counts), lines
    assert re.match(r"^Converting rows: [\d.]+ [kM]B, 3,000 lines in ", lines[-1]), lines[-1]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_bar_is_redrawn_in_place(fast_lines):
    terminal = _Terminal()
    with Progress("Downloading x", total=2_000_000, stream=terminal) as bar:
        for done in range(0, 2_000_001, 500_000):
            bar.update(done)
    text = terminal.getvalue()
    assert text.count("\n") <= 2 and text.count("\r") >= 4
    assert "Downloading x" in text and "100%" in text and "2.0 MB of 2.0 MB" in text


def test_status_lines_off_a_terminal_print_changes_and_a_line_every_few_seconds():
    now = [0.0]
    out = io.StringIO()
    status = StatusLines(stream=out, clock=lambda: now[0])
    for second, state in ((0, "PROVISIONING"), (1, "PROVISIONING"), (2, "PROVISIONING"),
                          (6, "PROVISIONING"), (7, "RUNNING")):
        now[0] = second
        status(f"cluster: {state} (0m{second:02d}s)", transient=True)
    status("Cluster ready.")
    assert out.getvalue().splitlines() == ["cluster: PROVISIONING (0m00s)", "cluster: PROVISIONING (0m06s)",
                                           "cluster: RUNNING (0m07s)", "Cluster ready."]

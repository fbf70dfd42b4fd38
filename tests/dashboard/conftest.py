"""A real dashboard (`mlbench dashboard`, a subprocess serving over TCP) on a real run store, and
Debian's Chromium driven by Playwright.

The module's run store is shared by its tests: two real finished task2a runs (1 and 2 workers)
are made with the CLI in the background while the first tests use the dashboard, so that the
slow parts (process starts) overlap. Chromium is Debian's `chromium` package, never a browser
Playwright downloads; without it (or without the Python packages) the browser tests are skipped
with the reason.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.helpers import mlbench

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
START_TIMEOUT = 180.0


def chromium_path() -> str | None:
    return shutil.which("chromium") or next(
        (p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser") if Path(p).exists()), None)


@dataclass
class Lab:
    """The module's run store, the dashboard serving it, and the finished runs being made."""

    env: dict[str, str]
    home: Path
    server: subprocess.Popen
    _lines: queue.Queue[str] = field(default_factory=queue.Queue)
    _url: str | None = None
    _runs: threading.Thread | None = None
    _runs_result: list = field(default_factory=list)

    @property
    def url(self) -> str:
        """The address the command printed, with its token (waits for the server)."""
        while self._url is None:
            try:
                line = self._lines.get(timeout=START_TIMEOUT)
            except queue.Empty:
                raise AssertionError("mlbench dashboard printed no address") from None
            if line is None:
                raise AssertionError(f"mlbench dashboard exited with {self.server.wait()}: "
                                     f"{self.server.stderr.read()}")
            if line.startswith("mlbench dashboard: "):
                self._url = line.split(": ", 1)[1].strip()
        return self._url

    @property
    def base(self) -> str:
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}"

    @property
    def token(self) -> str:
        return urlsplit(self.url).query.split("token=", 1)[1]

    def store(self):
        from mlbench.results.store import RunStore
        return RunStore(self.home)

    def finished_runs(self) -> list:
        """The 1- and 2-worker task2a runs (waits until `mlbench run` has made them)."""
        self._runs.join(timeout=600)
        proc = self._runs_result[0]
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return sorted((r for r in self.store().list() if r.group_id), key=lambda r: r.workers)


def start_dashboard(base: Path, preexec_fn=None) -> Lab:
    """`mlbench dashboard` serving the run store ``base/home`` (its own config and data folders);
    ``preexec_fn`` runs in its process before mlbench does (e.g. a lower limit on open files)."""
    for package in ("starlette", "uvicorn"):
        pytest.importorskip(package, reason=f"the dashboard needs {package} (pip install 'mlbench-suite[dashboard]')")
    env = dict(os.environ, MLBENCH_HOME=str(base / "home"), MLBENCH_CONFIG_DIR=str(base / "config"),
               MLBENCH_DATA=str(base / "data"), PYTHONUNBUFFERED="1")
    server = subprocess.Popen([sys.executable, "-m", "mlbench", "dashboard", "--port", "0"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True, preexec_fn=preexec_fn)
    lab = Lab(env, base / "home", server)

    def read_lines():
        for line in server.stdout:
            lab._lines.put(line)
        lab._lines.put(None)

    threading.Thread(target=read_lines, daemon=True).start()
    return lab


def stop_dashboard(lab: Lab) -> None:
    lab.server.send_signal(signal.SIGTERM)
    try:
        lab.server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        lab.server.kill()
        lab.server.wait()


@contextlib.contextmanager
def serving(base: Path, preexec_fn=None) -> Iterator[Lab]:
    """:func:`start_dashboard`, stopped when the block ends; it has printed its address first."""
    lab = start_dashboard(base, preexec_fn)
    try:
        assert lab.url
        yield lab
    finally:
        stop_dashboard(lab)


@pytest.fixture(scope="module")
def lab(tmp_path_factory, libsvm_dir):
    lab = start_dashboard(tmp_path_factory.mktemp("dashboard-lab"))
    env = lab.env
    lab._runs = threading.Thread(target=lambda: lab._runs_result.append(mlbench(
        "run", "task2a", "1", "2", "--data-dir", str(libsvm_dir), "--light", env=env, timeout=500)))
    lab._runs.start()
    try:
        yield lab
    finally:
        lab._runs.join(timeout=600)
        from mlbench.launch.registry import launcher_of
        store = lab.store()
        for record in store.list():
            if record.active:
                launcher_of(store, record).cancel(record)
        stop_dashboard(lab)


@pytest.fixture(scope="module")
def browser(lab, tmp_path_factory):
    """Headless Debian Chromium with the dashboard's cookie (the printed address opened once)."""
    executable = chromium_path()
    if executable is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium); .ci/run installs it")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the package only)")
    playwright = sync_api.sync_playwright().start()
    try:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=executable,
            headless=True, args=CHROMIUM_ARGS, viewport={"width": 1360, "height": 900},
            bypass_csp=True)  # Playwright's wait_for_function evaluates strings, which the CSP forbids
    except Exception as err:
        playwright.stop()
        pytest.skip(f"Chromium at {executable} did not start under Playwright: {err}")
    context.set_default_timeout(60_000)
    try:
        page = context.new_page()
        page.goto(lab.url)  # sets the cookie and drops the token from the address
        assert "token=" not in page.url
        page.close()
        yield context
    finally:
        context.close()
        playwright.stop()


@pytest.fixture
def page(browser):
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    yield page
    page.close()
    assert not errors, f"the page's scripts failed: {errors}"

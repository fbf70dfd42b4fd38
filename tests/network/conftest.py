"""Fixtures for the network tests: skip where this machine cannot shape, and find leftovers.

A run's namespaces exist only inside its holder's namespaces (mlbench.network.netns), so the
host's own ``ip netns`` and ``ip link`` never show them; that they are *gone* is checked the way
the kernel decides it: no process, open descriptor or mount refers to them any more.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlbench.network.emulation import _check

OUR_NAMES = re.compile(r"\b(mlb\w*|w\d+)\b")


def shaping_problem(needs_netem: bool = False) -> str | None:
    try:
        return _check(needs_netem)
    except (OSError, subprocess.SubprocessError) as err:
        return str(err)


@pytest.fixture
def shaping():
    """Skip (with the reason) where this machine cannot build an emulated network."""
    problem = shaping_problem()
    if problem:
        pytest.skip(problem)


@pytest.fixture
def netem(shaping):
    """Skip where the kernel has no netem (delay, jitter, loss)."""
    problem = shaping_problem(needs_netem=True)
    if problem:
        pytest.skip(problem)


def _host_names() -> set[str]:
    """Names of ours in the host's namespace list, links and qdiscs (there must be none)."""
    out = ""
    for argv in (["ip", "netns", "list"], ["ip", "-o", "link", "show"], ["tc", "qdisc", "show"]):
        out += subprocess.run(argv, capture_output=True, text=True).stdout
    return set(OUR_NAMES.findall(out))


@pytest.fixture(autouse=True)
def host_network_untouched():
    """Nothing of ours ever appears in the host's network, during or after a test."""
    before = _host_names()
    yield
    assert _host_names() == before


def boot_clock() -> float:
    """Seconds since boot, the clock of a process's start time in ``/proc/PID/stat``."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _started_at(pid: str) -> float:
    """When process ``pid`` started, in seconds since boot (field 22 of its stat line)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")


def namespace_references(started_by: float | None = None) -> set[str]:
    """Every network namespace something refers to: a process, an open descriptor or a mount.

    The kernel reuses a freed namespace's number for the next one made, so a test that made a
    namespace and then finds its number referenced may be seeing another test's new namespace.
    ``started_by`` (seconds since boot, :func:`boot_clock`, read before the test's holders
    stopped) counts only processes started by then: a leftover of the test started earlier, a
    namespace made later by someone else is held by a process started later."""
    refs = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if started_by is not None and _started_at(pid) > started_by:
                continue
            refs.add(os.readlink(f"/proc/{pid}/ns/net"))
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("net:["):
                    refs.add(link)
            refs.update(re.findall(r"net:\[\d+\]", Path(f"/proc/{pid}/mountinfo").read_text()))
        except OSError:
            continue
    return refs


def run_namespaces(run_dir: Path) -> set[str]:
    """The network namespaces of a running local run: its holder's (the switch) and its workers'."""
    pids = json.loads((run_dir / "pids.json").read_text())
    found = set()
    for pid in [pids["network"], *pids["workers"]]:
        found.add(os.readlink(f"/proc/{pid}/ns/net"))
    return found


def wait_gone(namespaces: set[str], timeout: float = 15) -> None:
    """Until nothing refers to any of ``namespaces`` (the kernel then frees them and their links):
    nothing started before this call, as a process started later is not the run's."""
    started_by = boot_clock()
    deadline = time.monotonic() + timeout
    while namespaces & namespace_references(started_by):
        if time.monotonic() > deadline:
            raise AssertionError(f"still referenced: {sorted(namespaces & namespace_references(started_by))}")
        time.sleep(0.2)


@contextlib.contextmanager
def nobody_folder() -> Iterator[tuple[str, Path]]:
    """The system Python and a folder anyone may write, for code run as ``nobody`` through
    ``setpriv`` (it needs nothing but the standard library and the repository); skips where this
    process is not root or the machine has no setpriv or system Python."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root to become an unprivileged user (setpriv)")
    python = "/usr/bin/python3"
    if not os.access(python, os.X_OK):
        pytest.skip(f"no system Python at {python} for the unprivileged user")
    with tempfile.TemporaryDirectory(prefix="mlbench-nobody-") as folder:  # pytest's is root's only
        os.chmod(folder, 0o777)
        yield python, Path(folder)

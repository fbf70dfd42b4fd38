"""The static checks pass: `ruff check mlbench tests` and `mypy`, both as configured in pyproject.toml.

Each runs as `python -m TOOL` from the repository root with this interpreter (so the packages
mypy reads are the ones the tests import); a tool that is not installed skips its test.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_tool(module: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (it comes with the test extra: pip install -e '.[test]')")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def output(proc: subprocess.CompletedProcess) -> str:
    return f"exit code {proc.returncode}\n{proc.stdout}{proc.stderr}"


def test_ruff_finds_nothing_in_the_package_or_its_tests():
    proc = run_tool("ruff", "check", "mlbench", "tests", timeout=240)
    assert proc.returncode == 0, output(proc)


#: mypy's incremental cache, kept between test sessions as the real node's images are (a clean
#: clone has no .mypy_cache: without it mypy re-reads torch's and numpy's types every time, three
#: minutes on a loaded 2-core box). mypy checks each cached module against its file's hash, so a
#: cache from another checkout gives the same verdict as none.
MYPY_CACHE = Path(os.environ.get("MLBENCH_TEST_MYPY_CACHE", Path.home() / ".cache" / "mlbench-test-mypy"))


@pytest.mark.timeout(900)  # a first run, without mypy's cache, takes a minute or more
def test_mypy_finds_no_error():
    proc = run_tool("mypy", "--cache-dir", str(MYPY_CACHE), timeout=840)
    assert proc.returncode == 0, output(proc)

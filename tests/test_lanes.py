"""The unit lane (tests/lanes.py): its modules exist, and in it no test can start a process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.lanes import UNIT_MODULES

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import multiprocessing, os, subprocess, sys
from tests.lanes import ProcessForbidden, forbid_processes
forbid_processes()
tries = {
    "subprocess": lambda: subprocess.run([sys.executable, "-c", "pass"]),
    "fork": os.fork,
    "system": lambda: os.system("true"),
    "spawn": lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
    "forkserver": lambda: multiprocessing.get_context("forkserver").Process(target=print).start(),
    "fork context": lambda: multiprocessing.get_context("fork").Process(target=print).start(),
}
for name, start in tries.items():
    try:
        start()
    except ProcessForbidden:
        print(name, "refused")
    else:
        print(name, "STARTED")
"""


def test_the_unit_modules_exist_and_are_test_modules():
    assert UNIT_MODULES and len(set(UNIT_MODULES)) == len(UNIT_MODULES)
    for module in UNIT_MODULES:
        assert (REPO / module).is_file() and Path(module).name.startswith("test_"), module


def test_in_the_lane_every_way_of_starting_a_process_is_refused():
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"{name} refused" for name in (
        "subprocess", "fork", "system", "spawn", "forkserver", "fork context")], proc.stdout + proc.stderr

"""A real run (or a reference value) made once per test session and read by every test that needs
it (issue 20, part 6).

Some tests compare a run against the same run made elsewhere: a port's two-worker run on Slurm
against the local one, which tests/frameworks makes for its own checks. Each local run of a port
is two fresh interpreters importing TensorFlow or JAX and torch (about 20 CPU-seconds for
TensorFlow), which the loaded CI box pays in minutes. So such a run is made by whichever test asks
first, in a home of its own, and the others read it there.

The tests asking may run in different pytest-xdist worker processes at the same time: the first
takes a file lock and makes the run, the others wait on the lock and then read its record. The
folder is the session's (xdist's workers share their base temporary folder's parent; a single
process uses its own base folder), so no run is ever read from an earlier session. A run that
failed is not recorded: the next test to ask makes it again, and fails with its own output.
"""

from __future__ import annotations

import fcntl
import os
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tests.helpers import mlbench

T = TypeVar("T")


@dataclass
class SharedRun:
    """The record of the run (its ``run_dir`` is in the shared home) and what the CLI printed
    on its standard output and error."""

    record: Any
    stdout: str
    stderr: str = ""


class SharedRuns:
    """The session's shared runs, by name, under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def get(self, name: str, args: Sequence[str], timeout: float = 600) -> SharedRun:
        """The run ``name``, made by `mlbench run ARGS` if no test of the session made it yet.
        Every caller of one ``name`` must pass the same ``args`` (paths to equal files aside)."""
        from mlbench.results.store import RunStore

        folder = self.root / name

        def make() -> dict[str, Any]:
            env = dict(os.environ, MLBENCH_HOME=str(folder / "home"), MLBENCH_CONFIG_DIR=str(folder / "config"),
                       MLBENCH_DATA=str(folder / "data-cache"))
            proc = mlbench("run", *args, env=env, check=True, timeout=timeout)
            run_id = RunStore(folder / "home", read_only=True).list()[-1].id
            return {"run_id": run_id, "args": list(args), "stdout": proc.stdout, "stderr": proc.stderr}

        recorded = self.value(name, make)
        return SharedRun(RunStore(folder / "home", read_only=True).get(recorded["run_id"]), recorded["stdout"],
                         recorded["stderr"])

    def value(self, name: str, compute: Callable[[], T]) -> T:
        """``compute()``, computed by whichever test of the session asks first (in any worker
        process) and read by the others from its pickle: a reference that tests in modules on
        different pytest-xdist workers compare against, such as the PyTorch ResNet that both
        ports of task 1a are checked against (a session fixture is once per worker, not once
        per session). Every caller of one ``name`` must compute the same thing."""
        path = self.root / f"{name}.pickle"
        with open(self.root / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)   # released when the file is closed
            if not path.exists():
                value = compute()
                partial = path.with_suffix(".partial")
                partial.write_bytes(pickle.dumps(value))
                partial.replace(path)
                return value
        return pickle.loads(path.read_bytes())


#: the steps of a port's shared two-worker run of task 2a
PORT_RUN_STEPS = 12


def port_run_args(framework: str, data_dir: Path) -> tuple[str, ...]:
    """A port's two-worker run of task 2a on the suite's LIBSVM files (tests/conftest.py's
    ``libsvm_dir``): tests/frameworks checks it against one process with the doubled batch,
    tests/slurm the same run on Slurm against it. Every step logged; ``lr.alpha=400`` makes the
    steps large enough that a wrong average of the two workers' gradients shows."""
    return ("task2a", "2", "--framework", framework, "--data-dir", str(data_dir), "--max-steps",
            str(PORT_RUN_STEPS), "--log-every", "1", "--no-stop", "--set", "lr.alpha=400")


def port_run(runs: SharedRuns, framework: str, data_dir: Path) -> SharedRun:
    """The session's local run of :func:`port_run_args`."""
    return runs.get(f"{framework}-task2a-two-workers", port_run_args(framework, data_dir))


def session_root(base_temp: Path) -> Path:
    """The folder every worker process of this session sees: the parent of an xdist worker's base
    folder (``.../pytest-N/popen-gwX``), else the base folder itself."""
    return (base_temp.parent if os.environ.get("PYTEST_XDIST_WORKER") else base_temp) / "shared-runs"

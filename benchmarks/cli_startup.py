"""How fast the CLI answers: `mlbench --help`, `mlbench status`, a shell completion, the
checking and recording of a run (`mlbench run --record-only`, what `mlbench run` does before any
worker starts) and an export of a run to TensorBoard's files, against `python -c pass` measured
in the same run (docs/performance.md, "CLI start-up").

    python benchmarks/cli_startup.py [--home DIR] [--repeat 15]
    cd /tmp && PYTHONPATH=OTHER_CHECKOUT python /path/to/cli_startup.py   # another version's mlbench
                                              # (outside both: `python -m` puts the current folder first)

Without --home, a temporary run store is filled with two real short runs first (task2a on
synthetic data, 1 and 2 workers), so that `status` and the completion read real records. Every
command runs as a fresh process (`python -m mlbench ...`), as a shell runs it; the table gives
the median and the fastest of the repeats, and the median minus that of `python -c pass`: the
time mlbench itself costs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

COMMANDS = {
    "python -c pass": ([sys.executable, "-c", "pass"], {}),
    "mlbench --help": ([sys.executable, "-m", "mlbench", "--help"], {}),
    "mlbench status": ([sys.executable, "-m", "mlbench", "status"], {}),
    "completion: mlbench status <Tab>": ([sys.executable, "-m", "mlbench"],
                                         {"_MLBENCH_COMPLETE": "bash_complete",
                                          "COMP_WORDS": "mlbench status ", "COMP_CWORD": "2"}),
    "mlbench run task2a 2 --data synthetic --record-only": (
        [sys.executable, "-m", "mlbench", "run", "task2a", "2", "--data", "synthetic", "--record-only"], {}),
    # {run}: the store's newest run; {out}: a new folder each time
    "mlbench export RUN --to tensorboard DIR": (
        [sys.executable, "-m", "mlbench", "export", "{run}", "--to", "tensorboard", "{out}"], {}),
}


def newest_run(env: dict[str, str]) -> str:
    listing = subprocess.run([sys.executable, "-m", "mlbench", "status", "-o", "json"], env=env, check=True,
                             capture_output=True, text=True).stdout
    return max(json.loads(listing)["runs"], key=lambda run: run["created_at"])["id"]


def seconds(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def fill_store(env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-m", "mlbench", "run", "task2a", "1", "2", "--data", "synthetic",
                    "--max-steps", "20", "--log-every", "10"], env=env, check=True,
                   stdout=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", help="an existing run store (default: a new one with two runs)")
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(os.environ, MLBENCH_CONFIG_DIR=str(Path(scratch) / "config"))
        env["MLBENCH_HOME"] = args.home or str(Path(scratch) / "home")
        if not args.home:
            fill_store(env)
        run_id, folders = newest_run(env), itertools.count()
        times: dict[str, list[float]] = {name: [] for name in COMMANDS}
        for _ in range(args.repeat):  # interleaved, so that a change of load hits every command
            for name, (command, extra) in COMMANDS.items():
                filled = [word.format(run=run_id, out=Path(scratch) / f"export-{next(folders)}") for word in command]
                times[name].append(seconds(filled, {**env, **extra}))
    base = statistics.median(times["python -c pass"])
    rows = [[name, f"{1000 * statistics.median(t):.0f}", f"{1000 * min(t):.0f}",
             "" if name == "python -c pass" else f"{1000 * (statistics.median(t) - base):+.0f}"]
            for name, t in times.items()]
    print(tabulate(rows, headers=["command", "median (ms)", "fastest (ms)", "vs python -c pass (ms)"],
                   colalign=("left", "right", "right", "right")))
    print(f"\n{args.repeat} runs each, interleaved; Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

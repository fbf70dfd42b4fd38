"""How much a short local run costs with its workers forked from the supervisor (the default,
mlbench/launch/forked.py) against fresh interpreters (`MLBENCH_NO_FORK=1`, the plain baseline),
measured in the same run (docs/performance.md, "Local worker start").

    python benchmarks/worker_start.py [--workers 1 2 4] [--repeat 7] [--steps 2] [--framework jax]
                                      [--task task1a]

Each sample is a whole `mlbench run TASK K --data synthetic --max-steps STEPS` (TASK: task2a
unless ``--task`` says another) as a user types
it (a fresh CLI process; with ``--framework``, a port's run, whose forked ranks share the
framework the supervisor imported for them): its wall time, and the CPU seconds of the CLI and every process it
waited for (getrusage of the children). The two ways alternate, so that a change of load hits
both; the table gives the median and the range of the repeats.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

WAYS = {"forked (default)": {}, "fresh interpreters (MLBENCH_NO_FORK=1)": {"MLBENCH_NO_FORK": "1"}}


def one_run(workers: int, steps: int, env: dict[str, str], framework: str = "pytorch",
            task: str = "task2a") -> tuple[float, float]:
    """(wall seconds, CPU seconds of the CLI and its workers) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mlbench", "run", task, str(workers), "--data", "synthetic",
                    "--max-steps", str(steps), "--framework", framework], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--framework", default="pytorch", help="pytorch, jax or tensorflow")
    parser.add_argument("--task", default="task2a", help="task2a (logistic regression) or task1a (a ResNet)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        env = {k: v for k, v in os.environ.items() if k != "MLBENCH_NO_FORK"}
        env.update(MLBENCH_HOME=str(Path(scratch) / "home"), MLBENCH_CONFIG_DIR=str(Path(scratch) / "config"),
                   MLBENCH_DATA=str(Path(scratch) / "data"))
        for workers in args.workers:
            samples: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
            # warm the page cache once, outside the samples
            one_run(workers, args.steps, env, args.framework, args.task)
            for _ in range(args.repeat):
                for way, extra in WAYS.items():
                    samples[way].append(one_run(workers, args.steps, {**env, **extra}, args.framework, args.task))
            base_cpu = statistics.median(cpu for _, cpu in samples["fresh interpreters (MLBENCH_NO_FORK=1)"])
            for way, taken in samples.items():
                walls, cpus = [w for w, _ in taken], [c for _, c in taken]
                rows.append([workers, way, spread(walls), spread(cpus),
                             f"{100 * (statistics.median(cpus) / base_cpu - 1):+.0f}%"])
    print(tabulate(rows, headers=["workers", "workers start as", "wall s, median (range)",
                                  "CPU s, median (range)", "CPU vs fresh"],
                   colalign=("right", "left", "right", "right", "right")))
    print(f"\n{args.repeat} runs each of `mlbench run {args.task} K --data synthetic --max-steps {args.steps} "
          f"--framework {args.framework}`, "
          f"interleaved; Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

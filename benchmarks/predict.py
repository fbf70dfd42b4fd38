"""How well `mlbench predict` predicts step time: predicted vs measured, cell by cell, from one calibration.

    python benchmarks/predict.py                                  # tasks 2a and 1a, 2-4 workers, 4 rates
    python benchmarks/predict.py --tasks task2a --workers 2 3 --bandwidth 1gbit,100mbit
    python benchmarks/predict.py --optimizers centralized-sgd powersgd --steps 40
    python benchmarks/predict.py --tasks task1a --optimizers centralized-sgd powersgd model-averaging ddp

As the simulators are validated (ASTRA-sim, SimAI: predicted against measured per case): one
calibration per task (`mlbench predict TASK --calibrate`: two task-0a sweeps per emulated rate
and on the machine's own network, and each optimizer's short run at every worker count without
emulation), then one real run per cell (optimizer x workers x rate, `mlbench run TASK N
--bandwidth RATE`), each predicted from the calibration without it (`mlbench predict --validate`).
The compute term at each worker count is the calibration's run at that count: on a machine whose
cores the workers share, compute slows with the worker count, and the model takes that from a
measurement, so the table tests the network and optimizer terms. The baseline of each cell is its
own measured step time (the median over its logging intervals of training seconds per step).

Every run trains on random data of the task's shape (--data synthetic): a step costs what it
costs on the real data set, and no download is needed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import machine_line

from mlbench.network.settings import network_options

#: steps of each run, by task: enough logging intervals for a median after the first (warm-up)
STEPS = {"task2a": 60, "task1a": 24}


def mlbench(home: Path, *args: str) -> str:
    """`mlbench ARGS` in the benchmark's own store; its standard output (raises on failure)."""
    proc = subprocess.run([sys.executable, "-m", "mlbench", *args], capture_output=True, text=True,
                          env={**os.environ, "MLBENCH_HOME": str(home)}, check=False)
    if proc.returncode not in (0, 3):
        raise SystemExit(f"mlbench {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def newest_run(home: Path) -> str:
    return json.loads(mlbench(home, "status", "-o", "json"))["runs"][0]["id"]


def validate_task(home: Path, task: str, optimizers: list[str], workers: list[int], bandwidth: str,
                  steps: int, busy_ok: bool) -> list[dict]:
    """The calibration of ``task``, then one run per cell and its prediction."""
    rates = [n.label() for n in network_options(bandwidth, None, None, None) if n is not None]
    log_every = str(max(1, steps // 6))
    calibrate = ["predict", task, "--calibrate", "--optimizer", ",".join(optimizers), "--bandwidth", bandwidth,
                 "--calibration-workers", ",".join(map(str, workers)), "--calibration-steps", str(steps),
                 "--data", "synthetic", "--workers", ",".join(map(str, workers))]
    print(f"calibrating {task}: mlbench {' '.join(calibrate)}", file=sys.stderr, flush=True)
    mlbench(home, *calibrate, *(["--busy-ok"] if busy_ok else []))
    cells = []
    for rate, rate_arg in zip(rates, bandwidth.split(",")):
        for optimizer in optimizers:
            for count in workers:
                print(f"  {task} {optimizer} {count} workers at {rate}", file=sys.stderr, flush=True)
                mlbench(home, "run", task, str(count), "--optimizer", optimizer, "--bandwidth", rate_arg,
                        "--data", "synthetic", "--max-steps", str(steps), "--log-every", log_every)
                cells.append({"task": task, "optimizer": optimizer, "workers": count, "rate": rate,
                              "run": newest_run(home)})
    answer = json.loads(mlbench(home, "predict", "--validate", *[c["run"] for c in cells], "-o", "json"))
    for cell, checked in zip(cells, answer["validation"], strict=True):
        cell.update(predicted=checked["predicted"]["step_s"], measured=checked["measured_step_s"],
                    # the communication that does not overlap compute: what the phase measures
                    predicted_comm=checked["predicted"]["communication_s"] - checked["predicted"]["hidden_s"],
                    measured_comm=checked["measured_communication_s"], error=checked["error"])
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["task2a", "task1a"])
    parser.add_argument("--optimizers", nargs="+", default=["centralized-sgd", "powersgd", "model-averaging"])
    parser.add_argument("--workers", nargs="+", type=int, default=[2, 3, 4])
    parser.add_argument("--bandwidth", default="1gbit,300mbit,100mbit,30mbit")
    parser.add_argument("--steps", type=int, help="steps of each run [task2a 60, task1a 24]")
    parser.add_argument("--busy-ok", action="store_true", help="calibrate even on a busy machine")
    args = parser.parse_args()
    print(machine_line(f"{', '.join(args.tasks)}; {', '.join(args.optimizers)}; {args.workers} workers; "
                       f"{args.bandwidth}"))
    with tempfile.TemporaryDirectory(prefix="mlbench-predict-") as folder:
        cells = []
        for task in args.tasks:
            cells += validate_task(Path(folder), task, args.optimizers, args.workers, args.bandwidth,
                                   args.steps or STEPS.get(task, 30), args.busy_ok)
    rows = [[c["task"], c["optimizer"], c["workers"], c["rate"], f"{1e3 * c['measured']:.2f}",
             f"{1e3 * c['predicted']:.2f}", f"{100 * c['error']:+.1f}%", f"{1e3 * c['measured_comm']:.2f}",
             f"{1e3 * c['predicted_comm']:.2f}"] for c in cells]
    print(tabulate(rows, headers=["task", "optimizer", "workers", "network", "measured ms/step",
                                  "predicted ms/step", "error", "measured comm ms", "predicted comm ms"]))
    for task in args.tasks:
        errors = [abs(c["error"]) for c in cells if c["task"] == task]
        print(f"{task}: median absolute error {100 * statistics.median(errors):.1f}%, "
              f"largest {100 * max(errors):.1f}%, over {len(errors)} cells")
    errors = [abs(c["error"]) for c in cells]
    print(f"all: median absolute error {100 * statistics.median(errors):.1f}%, largest {100 * max(errors):.1f}%, "
          f"cells over 25%: {sum(e > 0.25 for e in errors)} of {len(errors)}")


if __name__ == "__main__":
    main()

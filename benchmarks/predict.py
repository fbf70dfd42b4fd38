"""How well `mlbench predict` predicts step time: predicted vs measured, cell by cell, from one calibration.

    python benchmarks/predict.py                                  # tasks 2a and 1a, 2-4 workers, 4 rates
    python benchmarks/predict.py --tasks task2a --workers 2 3 --bandwidth 1gbit,100mbit
    python benchmarks/predict.py --optimizers centralized-sgd powersgd --steps 40
    python benchmarks/predict.py --tasks task1a --optimizers centralized-sgd powersgd model-averaging ddp
    python benchmarks/predict.py --tasks task2a --repeat 5 --keep /tmp/predict-2a  # keep the runs
    python benchmarks/predict.py --from /tmp/predict-2a            # score the model on them again

As the simulators are validated (ASTRA-sim, SimAI: predicted against measured per case): one
calibration per task (`mlbench predict TASK --calibrate`: three task-0a sweeps per emulated rate
and on the machine's own network, and three short runs of each optimizer at every worker count
without emulation), then real runs per cell (optimizer x workers x rate, `mlbench run TASK N
--bandwidth RATE`), --repeat of them, interleaved: one round of every cell, then the next, so
that a slow minute of the machine spreads over the cells instead of falling on one. Every run is
predicted from the calibration alone (`mlbench predict --validate` leaves every run it checks out
of the calibration). A cell's measurement is the median of its runs, and the table prints their
spread (slowest over fastest).
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
STEPS = {"task2a": 300, "task1a": 24}


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
                  steps: int, busy_ok: bool, repeat: int, sweep_iterations: int | None,
                  calibration_repeat: int | None = None) -> list[dict]:
    """The calibration of ``task``, then ``repeat`` runs per cell (the cells interleaved: one round
    of every cell, then the next) and its prediction; a cell's measurement is its runs' median."""
    rates = [n.label() for n in network_options(bandwidth, None, None, None) if n is not None]
    log_every = str(max(1, steps // 6))
    calibrate = ["predict", task, "--calibrate", "--optimizer", ",".join(optimizers), "--bandwidth", bandwidth,
                 "--calibration-workers", ",".join(map(str, workers)), "--calibration-steps", str(steps),
                 "--data", "synthetic", "--workers", ",".join(map(str, workers)),
                 *(["--sweep-iterations", str(sweep_iterations)] if sweep_iterations else []),
                 *(["--calibration-repeat", str(calibration_repeat)] if calibration_repeat else [])]
    print(f"calibrating {task}: mlbench {' '.join(calibrate)}", file=sys.stderr, flush=True)
    mlbench(home, *calibrate, *(["--busy-ok"] if busy_ok else []))
    cells = [{"task": task, "optimizer": optimizer, "workers": count, "rate": rate, "rate_arg": rate_arg, "runs": []}
             for rate, rate_arg in zip(rates, bandwidth.split(",")) for optimizer in optimizers for count in workers]
    for round_ in range(repeat):
        for cell in cells:
            print(f"  {task} {cell['optimizer']} {cell['workers']} workers at {cell['rate']} "
                  f"({round_ + 1} of {repeat})", file=sys.stderr, flush=True)
            mlbench(home, "run", task, str(cell["workers"]), "--optimizer", cell["optimizer"],
                    "--bandwidth", cell["rate_arg"], "--data", "synthetic", "--max-steps", str(steps),
                    "--log-every", log_every)
            cell["runs"].append(newest_run(home))
    return score(home, cells)


def kept_cells(home: Path, tasks: list[str]) -> list[dict]:
    """The cells of a store that ``--keep`` kept: its runs on an emulated network (the
    calibration's ran without), by task, optimizer, workers and rate, in the order they ran."""
    listed = json.loads(mlbench(home, "status", "--all", "-o", "json"))["runs"]
    cells: dict[tuple, dict] = {}
    for run in sorted(listed, key=lambda r: r["created_at"]):
        if run["task"] in tasks and run["state"] == "finished" and run.get("network") not in (None, "not emulated"):
            key = (run["task"], run["optimizer"], run["workers"], run["network"])
            cells.setdefault(key, {"task": key[0], "optimizer": key[1], "workers": key[2], "rate": key[3],
                                   "runs": []})["runs"].append(run["id"])
    if not cells:
        raise SystemExit(f"--from {home}: no finished run of {', '.join(tasks)} on an emulated network there")
    return list(cells.values())


def score(home: Path, cells: list[dict]) -> list[dict]:
    """Each cell's median measured and predicted step time (`mlbench predict --validate` of
    all the cells' runs together: none of them calibrates another) and its error."""
    runs = [run for cell in cells for run in cell["runs"]]
    answer = json.loads(mlbench(home, "predict", "--validate", *runs, "-o", "json"))
    checked = dict(zip(runs, answer["validation"], strict=True))
    for cell in cells:
        each = [checked[run] for run in cell["runs"]]
        measured = [c["measured_step_s"] for c in each]
        # every repeat has the same prediction but the run itself left out of the calibration
        predicted = statistics.median(c["predicted"]["step_s"] for c in each)
        cell.update(predicted=predicted, measured=statistics.median(measured), spread=max(measured) / min(measured),
                    # the communication that does not overlap compute: what the phase measures
                    predicted_comm=statistics.median(c["predicted"]["communication_s"] - c["predicted"]["hidden_s"]
                                                     for c in each),
                    measured_comm=statistics.median(c["measured_communication_s"] for c in each))
        cell["error"] = cell["predicted"] / cell["measured"] - 1
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["task2a", "task1a"])
    parser.add_argument("--optimizers", nargs="+", default=["centralized-sgd", "powersgd", "model-averaging"])
    parser.add_argument("--workers", nargs="+", type=int, default=[2, 3, 4])
    parser.add_argument("--bandwidth", default="1gbit,300mbit,100mbit,30mbit")
    parser.add_argument("--steps", type=int, help="steps of each run [task2a 300, task1a 24]")
    parser.add_argument("--repeat", type=int, default=3, help="runs per cell, interleaved; a cell is their median")
    parser.add_argument("--sweep-iterations", type=int, help="timed all-reduces per message size in the "
                        "calibration's sweeps [mlbench predict's]")
    parser.add_argument("--calibration-repeat", type=int, help="calibration runs per optimizer and worker "
                        "count [mlbench predict's]")
    parser.add_argument("--busy-ok", action="store_true", help="calibrate even on a busy machine")
    parser.add_argument("--keep", type=Path, metavar="HOME", help="make and keep the runs in this new store "
                        "(`MLBENCH_HOME=HOME mlbench predict --validate` checks the model on them again) "
                        "[a temporary one]")
    parser.add_argument("--from", dest="kept", type=Path, metavar="HOME", help="make no runs: score the model "
                        "on the runs a --keep store holds (the same runs after a change to the model)")
    args = parser.parse_args()
    if args.kept is not None:
        print(machine_line(f"the runs kept in {args.kept}"))
        cells = kept_cells(args.kept, args.tasks)
        args.tasks = list(dict.fromkeys(c["task"] for c in cells))
        cells = [scored for task in args.tasks for scored in score(args.kept, [c for c in cells if c["task"] == task])]
    else:
        print(machine_line(f"{', '.join(args.tasks)}; {', '.join(args.optimizers)}; {args.workers} workers; "
                           f"{args.bandwidth}"))
        if args.keep is not None and args.keep.exists() and any(args.keep.iterdir()):
            raise SystemExit(f"--keep {args.keep}: give a new or empty folder (a calibration reads every run there)")
        with tempfile.TemporaryDirectory(prefix="mlbench-predict-") as folder:
            home = args.keep or Path(folder)
            cells = []
            for task in args.tasks:
                cells += validate_task(home, task, args.optimizers, args.workers, args.bandwidth,
                                       args.steps or STEPS.get(task, 30), args.busy_ok, args.repeat,
                                       args.sweep_iterations, args.calibration_repeat)
    rows = [[c["task"], c["optimizer"], c["workers"], c["rate"], f"{1e3 * c['measured']:.2f}",
             f"{c['spread']:.2f}x", f"{1e3 * c['predicted']:.2f}", f"{100 * c['error']:+.1f}%",
             f"{1e3 * c['measured_comm']:.2f}", f"{1e3 * c['predicted_comm']:.2f}"] for c in cells]
    print(tabulate(rows, headers=["task", "optimizer", "workers", "network", "measured ms/step", "repeats' spread",
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

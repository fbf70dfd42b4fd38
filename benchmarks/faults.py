"""Training under faults (issue 24, part 6): each recovery policy against the same runs without
faults, and the checkpoint interval that maximises goodput against the Young/Daly estimate.

    python benchmarks/faults.py                                  # task 2a, synthetic, 2 workers, scaled down
    python benchmarks/faults.py --task task1a --light --data-dir ~/data/cifar10 --workers 4 \\
        --steps 0 --kill-every 'rand(60s,120s)' --repeats 3      # the issue's setting, to the light goal

Every row is real runs through `mlbench.run` (the Python API, the launcher users get), in
interleaved rounds (benchmarks/measure.py): in each round every case runs once, all with the same
kill schedule (``--inject kill:rank=1,every=KILL,seed=ROUND``: the same moments for every policy
in a round, another draw in the next round).

* **policies**: no faults; kills with ``--on-failure fail``; kills with ``restart`` (and any other
  policy this version offers); one straggler (``--inject slow:rank=1,factor=3``) without kills.
  Columns: runs that ended as asked (finished; to the goal when the run has one), wall time from
  the workers' start to the end, goodput (productive training time / wall time, docs/faults.md),
  restarts, steps lost and done again, and the time to the goal (real data) or to the last step
  (``--steps N``, e.g. synthetic data, whose accuracy means nothing).
* **checkpoint interval**: ``restart`` under the same schedule at several checkpoint intervals.
  The checkpoint cost C is the median seconds a checkpoint took (the workers' ``checkpoint``
  events) and M the mean time between kills; Young's first-order optimum is sqrt(2 C M)
  (Young 1974; Daly 2006 adds the restart time R, which it neglects). The measured optimum
  differs where R dominates: a restart here costs the group's start and rendezvous, seconds,
  against a checkpoint of milliseconds.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from measure import machine_line, spread

import mlbench
from mlbench.launch.faults import POLICIES
from mlbench.launch.plan import parse_duration


def mean_interval(every: str) -> float:
    """The mean seconds between kills of ``--inject ...,every=EVERY``: T, or (A+B)/2 of rand(A,B)."""
    match = re.fullmatch(r"\s*rand\(\s*([^,]+?)\s*,\s*([^)]+?)\s*\)\s*", every)
    if match:
        return (parse_duration(match.group(1)) + parse_duration(match.group(2))) / 2
    return parse_duration(every)


class Case:
    """One row of a table: the options of its runs and what each run gave."""

    def __init__(self, label: str, **options: Any):
        self.label, self.options, self.runs = label, options, []

    def measure(self, common: dict[str, Any], round_seed: int) -> None:
        options = {**common, **self.options}
        options["inject"] = [text.replace("{seed}", str(round_seed)) for text in options.get("inject", [])]
        run = mlbench.run(**options)
        self.runs.append(run)


def _wall(run: mlbench.api.Run) -> float | None:
    if run.started_at is None or run.finished_at is None:
        return None
    return run.finished_at - run.started_at


def _ok(run: mlbench.api.Run, to_goal: bool) -> bool:
    return run.state == "finished" and (run.goal_reached is True or not to_goal)


def _median(values: list[float], fmt: str) -> str:
    return spread(values, fmt) if values else "-"


def policy_row(case: Case, to_goal: bool) -> list[str]:
    runs = case.runs
    done = [r for r in runs if _ok(r, to_goal)]
    goodputs = [r.faults["goodput"] for r in runs if r.faults and r.faults.get("goodput") is not None]
    finish = [r.time_to_accuracy if to_goal else _wall(r) for r in done]
    return [case.label, f"{len(done)}/{len(runs)}", _median([w for r in runs if (w := _wall(r))], "{:.1f}"),
            _median([100 * g for g in goodputs], "{:.1f}"),
            _median([float(r.faults["count"]) for r in runs if r.faults], "{:.0f}"),
            _median([float(r.faults["restarts"]) for r in runs if r.faults], "{:.0f}"),
            _median([float(r.faults["lost_steps"]) for r in runs if r.faults], "{:.0f}"),
            _median([f for f in finish if f is not None], "{:.1f}")]


def checkpoint_seconds(runs: list[mlbench.api.Run]) -> list[float]:
    return [e["value"]["seconds"] for r in runs for e in r.events(frame=False)
            if e["name"] == "checkpoint" and isinstance(e["value"], dict)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="task2a")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--data", default="synthetic", choices=["synthetic", "real"])
    parser.add_argument("--data-dir")
    parser.add_argument("--light", action="store_true")
    parser.add_argument("--steps", type=int, default=4000,
                        help="train this many steps (0: to the goal, with real data) [4000]")
    parser.add_argument("--kill-every", default="rand(10s,20s)", help="the kills' interval [rand(10s,20s)]")
    parser.add_argument("--checkpoint-every", default="2s", help="for the policy table [2s]")
    parser.add_argument("--intervals", nargs="+", default=["0.5s", "1s", "2s", "5s", "10s"],
                        help="checkpoint intervals of the second table")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    to_goal = args.steps == 0
    kill = f"kill:rank=1,every={args.kill_every},seed={{seed}}"
    with tempfile.TemporaryDirectory() as home:
        common: dict[str, Any] = {"task": args.task, "workers": args.workers, "data": args.data,
                                  "data_dir": args.data_dir, "light": args.light, "home": home,
                                  "max_steps": args.steps or None, "stop_at_goal": to_goal,
                                  "log_every": 50, "watchdog": "20s",
                                  # a step count is the work: no epoch cap ends a run before it
                                  "overrides": {} if to_goal else {"max_epochs": 1_000_000}}
        policies = [Case("no faults"),
                    *(Case(f"kill every {args.kill_every}, --on-failure {policy}", inject=[kill],
                           on_failure=policy, checkpoint_every=args.checkpoint_every) for policy in POLICIES),
                    Case("straggler: slow:rank=1,factor=3", inject=["slow:rank=1,factor=3"])]
        sweep = [Case(f"restart, checkpoint every {interval}", inject=[kill], on_failure="restart:1000",
                      checkpoint_every=interval) for interval in args.intervals]
        for round_seed in range(args.repeats):   # interleaved: every case once per round
            for case in policies + sweep:
                case.measure(common, round_seed)
        print(machine_line(f"{args.task} on {args.workers} workers, data {args.data}, "
                           f"{args.repeats} interleaved rounds; median (range)"))
        headers = ["case", "ended as asked", "wall s", "goodput %", "faults", "restarts", "steps lost",
                   "to goal s" if to_goal else "to last step s"]
        print(tabulate([policy_row(case, to_goal) for case in policies], headers=headers, tablefmt="github"))
        cost = checkpoint_seconds([r for case in sweep for r in case.runs])
        mtbf = mean_interval(args.kill_every)
        print()
        if cost:
            c = statistics.median(cost)
            print(f"checkpoint cost C = {1000 * c:.1f} ms (median of {len(cost)}), mean time between kills "
                  f"M = {mtbf:.1f} s: Young/Daly sqrt(2 C M) = {math.sqrt(2 * c * mtbf):.2f} s")
        rows = [policy_row(case, to_goal) for case in sweep]
        best = max(sweep, key=lambda case: statistics.median(
            [r.faults["goodput"] or 0.0 for r in case.runs if r.faults] or [0.0]))
        print(tabulate(rows, headers=headers, tablefmt="github"))
        print(f"\nhighest median goodput: {best.label}")


if __name__ == "__main__":
    main()

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

**Over several sittings** (``--record FILE --for 90m``): the issue's setting takes hours per
round on a CPU. With ``--record``, each run's figures are appended to FILE (JSON lines, with its
case, round, settings, machine and date) the moment it ends, runs FILE already holds for the same
settings are not run again, and no run starts after ``--for``: the script can be stopped and
started again, on another day, and goes on with the next (round, case) in order, a round's cases
all under that round's kill schedule. The tables are computed from FILE, with the machines and
dates of the runs they hold; ``--report`` prints them without running anything.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from measure import machine_line, spread

import mlbench
from mlbench.launch.faults import POLICIES
from mlbench.launch.plan import parse_duration
from mlbench.results.environment import cpu_model


def mean_interval(every: str) -> float:
    """The mean seconds between kills of ``--inject ...,every=EVERY``: T, or (A+B)/2 of rand(A,B)."""
    match = re.fullmatch(r"\s*rand\(\s*([^,]+?)\s*,\s*([^)]+?)\s*\)\s*", every)
    if match:
        return (parse_duration(match.group(1)) + parse_duration(match.group(2))) / 2
    return parse_duration(every)


class Case:
    """One row of a table: the options of its runs and each run's figures (:func:`figures`)."""

    def __init__(self, label: str, **options: Any):
        self.label, self.options, self.runs = label, options, []
        #: a case of the policy table whose runs are this one's (the same options): not run twice
        self.same_as: Case | None = None

    def measure(self, common: dict[str, Any], round_seed: int) -> dict[str, Any]:
        options = {**common, **self.options}
        options["inject"] = [text.replace("{seed}", str(round_seed)) for text in options.get("inject", [])]
        return figures(mlbench.run(**options))


def figures(run: mlbench.api.Run) -> dict[str, Any]:
    """What the tables need of a run, as JSON (a line of ``--record``)."""
    faults = run.faults or {}
    wall = None if run.started_at is None or run.finished_at is None else run.finished_at - run.started_at
    return {"state": run.state, "goal_reached": run.goal_reached, "wall_s": wall,
            "time_to_accuracy_s": run.time_to_accuracy, "goodput": faults.get("goodput"),
            "faults": faults.get("count"), "restarts": faults.get("restarts"), "lost_steps": faults.get("lost_steps"),
            "checkpoint_s": [e["value"]["seconds"] for e in run.events(frame=False)
                             if e["name"] == "checkpoint" and isinstance(e["value"], dict)]}


def _ok(run: dict[str, Any], to_goal: bool) -> bool:
    return run["state"] == "finished" and (run["goal_reached"] is True or not to_goal)


def _median(values: list[float], fmt: str) -> str:
    return spread(values, fmt) if values else "-"


def policy_row(case: Case, to_goal: bool) -> list[str]:
    runs = case.runs
    done = [r for r in runs if _ok(r, to_goal)]

    def numbers(key: str, scale: float = 1.0) -> list[float]:
        return [scale * r[key] for r in runs if r.get(key) is not None]

    finish = [r["time_to_accuracy_s"] if to_goal else r["wall_s"] for r in done]
    return [case.label, f"{len(done)}/{len(runs)}", _median(numbers("wall_s"), "{:.1f}"),
            _median(numbers("goodput", 100), "{:.1f}"), _median(numbers("faults"), "{:.0f}"),
            _median(numbers("restarts"), "{:.0f}"), _median(numbers("lost_steps"), "{:.0f}"),
            _median([f for f in finish if f is not None], "{:.1f}")]


class Record:
    """``--record FILE``: the runs of earlier sittings with these settings, and each new one appended."""

    def __init__(self, path: Path | None, settings: dict[str, Any]):
        self.path, self.settings = path, settings
        self.lines = []
        if path is not None and path.exists():
            self.lines = [line for line in map(json.loads, path.read_text().splitlines())
                          if line["settings"] == settings]

    def done(self, case: Case, round_seed: int) -> dict[str, Any] | None:
        return next((line["run"] for line in self.lines
                     if line["case"] == case.label and line["round"] == round_seed), None)

    def add(self, case: Case, round_seed: int, run: dict[str, Any]) -> None:
        line = {"case": case.label, "round": round_seed, "settings": self.settings, "run": run,
                "date": str(datetime.date.today()), "machine": machine(), "load_at_end": os.getloadavg()[0]}
        self.lines.append(line)
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as out:
                out.write(json.dumps(line) + "\n")

    def machines(self) -> str:
        seen = sorted({(line["date"], line["machine"]) for line in self.lines})
        return "; ".join(f"{date} {where}" for date, where in seen) or "-"


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, {cpu_model()}"


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
    parser.add_argument("--intervals", nargs="*", default=["0.5s", "1s", "2s", "5s", "10s"],
                        help="checkpoint intervals of the second table")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-restarts", type=int, default=1000,
                        help="N of the policy table's --on-failure restart:N [1000: every failure is "
                             "restarted; the tables so far were made with it]")
    parser.add_argument("--record", type=Path,
                        help="JSON lines: each run's figures are appended; runs already there are not run again")
    parser.add_argument("--for", dest="budget", help="start no run after this long (e.g. 90m); with --record")
    parser.add_argument("--report", action="store_true", help="print the tables of --record's runs, run nothing")
    args = parser.parse_args()
    to_goal = args.steps == 0
    kill = f"kill:rank=1,every={args.kill_every},seed={{seed}}"
    deadline = time.monotonic() + parse_duration(args.budget) if args.budget else math.inf
    settings = {"task": args.task, "workers": args.workers, "data": args.data, "light": args.light,
                "steps": args.steps, "kill_every": args.kill_every, "checkpoint_every": args.checkpoint_every}
    record = Record(args.record, settings)
    with tempfile.TemporaryDirectory() as home:
        common: dict[str, Any] = {"task": args.task, "workers": args.workers, "data": args.data,
                                  "data_dir": args.data_dir, "light": args.light, "home": home,
                                  "max_steps": args.steps or None, "stop_at_goal": to_goal,
                                  "log_every": 50, "watchdog": "20s",
                                  # a step count is the work: no epoch cap ends a run before it
                                  "overrides": {} if to_goal else {"max_epochs": 1_000_000}}
        policies = [Case("no faults"),
                    *(Case(f"kill every {args.kill_every}, --on-failure {policy}", inject=[kill],
                           on_failure=policy, checkpoint_every=args.checkpoint_every)
                      for policy in (f"{p}:{args.max_restarts}" if p == "restart" else p for p in POLICIES)),
                    Case("straggler: slow:rank=1,factor=3", inject=["slow:rank=1,factor=3"])]
        sweep = [Case(f"restart, checkpoint every {interval}", inject=[kill], on_failure="restart:1000",
                      checkpoint_every=interval) for interval in args.intervals]
        for case in sweep:   # the policy table's restart row at the interval of that table
            case.same_as = next((policy for policy in policies if policy.options == case.options), None)
        for round_seed in range(args.repeats):   # interleaved: every case once per round
            for case in policies + sweep:
                if case.same_as is not None:   # measured just before, in this round, as the policy row
                    shared = record.done(case.same_as, round_seed)
                    case.runs.extend([shared] if shared is not None else [])
                    continue
                earlier = record.done(case, round_seed)
                if earlier is not None:
                    case.runs.append(earlier)
                elif not args.report and time.monotonic() < deadline:   # once past it, no later run starts
                    run = case.measure(common, round_seed)
                    if run["state"] == "cancelled":   # a stop of this script (Ctrl-C, SIGTERM): no
                        deadline = -math.inf          # measurement, and no later run starts
                    else:
                        case.runs.append(run)
                        record.add(case, round_seed, run)
        report(args, policies, sweep, to_goal, record)


def report(args: argparse.Namespace, policies: list[Case], sweep: list[Case], to_goal: bool, record: Record) -> None:
    print(machine_line(f"{args.task} on {args.workers} workers, data {args.data}, "
                       f"{args.repeats} interleaved rounds; median (range)"))
    if args.record is not None:
        print(f"# runs of {args.record}: {len(record.lines)}, on {record.machines()}")
    headers = ["case", "ended as asked", "wall s", "goodput %", "faults", "restarts", "steps lost",
               "to goal s" if to_goal else "to last step s"]
    print(tabulate([policy_row(case, to_goal) for case in policies], headers=headers, tablefmt="github"))
    if not any(case.runs for case in sweep):
        return
    cost = [seconds for case in sweep for run in case.runs for seconds in run["checkpoint_s"]]
    mtbf = mean_interval(args.kill_every)
    print()
    if cost:
        c = statistics.median(cost)
        print(f"checkpoint cost C = {1000 * c:.1f} ms (median of {len(cost)}), mean time between kills "
              f"M = {mtbf:.1f} s: Young/Daly sqrt(2 C M) = {math.sqrt(2 * c * mtbf):.2f} s")
    print(tabulate([policy_row(case, to_goal) for case in sweep], headers=headers, tablefmt="github"))
    for case in sweep:
        if case.same_as is not None:
            print(f"({case.label}: the runs of the row '{case.same_as.label}' above, the same options)")
    measured = [case for case in sweep if case.runs]
    best = max(measured, key=lambda case: statistics.median(
        [run["goodput"] or 0.0 for run in case.runs if run["faults"] is not None] or [0.0]))
    print(f"\nhighest median goodput: {best.label}")


if __name__ == "__main__":
    main()

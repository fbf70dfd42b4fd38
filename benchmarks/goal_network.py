"""Time to the light goal of task 2a on an emulated network, per optimizer (plug-ins included).

    python benchmarks/goal_network.py --latency 0 --plugin "diloco H=10"
    python benchmarks/goal_network.py --latency 0 --bandwidth 1gbit --samples 2000 --features 50 --repeats 2

Task 1a's light goal (70% on CIFAR-10) takes an hour per run on a 2-core CPU; task 2a's
logistic regression reaches its light goal (80% test accuracy) in seconds, so the convergence of
an optimizer can be compared at every bandwidth on such a machine. The data set is generated
here (epsilon itself is 12 GB): ``--features`` dense Gaussian features (rows of norm ~1, as
epsilon's are normalised) labelled by a random
linear teacher with 10% of the labels flipped, ``--samples`` to train on and a tenth of that to
test on, in LIBSVM files. Every row is a real `mlbench run task2a K --light --bandwidth B
--optimizer ...` through the launcher (each worker in its own network namespace); it reports
the training time to the goal (evaluation excluded, as mlbench's time to accuracy is), the
epochs, and the bytes each worker sent per step.

Every case (each bandwidth's reference and optimizers) runs once per round, ``--repeats`` rounds
(benchmarks/measure.py): the table gives in how many rounds the goal was reached, the median
(fastest-slowest) of the rounds that reached it, and the time to the goal relative to the
reference's in the same round (the baseline here: task 2a has no plain loop to compare with).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import DEFAULT_REPEATS, interleave, machine_line, ratio_spread, spread
from network import _announced, _plugin_case, bench_home, shaped_networks

from mlbench.results.environment import cpu_model, usable_cores

CASES = [
    ("centralized-sgd (reference)", "centralized-sgd", {}),
    ("model-averaging", "model-averaging", {}),
    ("powersgd rank=2", "powersgd", {"rank": "2"}),
]


def write_data(root: Path, features: int, samples: int) -> Path:
    """The pair `data` / `data.t` of a noisy linear problem, in LIBSVM's text format."""
    rng = np.random.default_rng(0)
    teacher = rng.normal(size=features)
    for name, n in (("data", samples), ("data.t", samples // 10)):
        x = (rng.normal(size=(n, features)) / features ** 0.5).astype(np.float32)  # unit rows, as epsilon's
        y = np.where(x @ teacher >= 0, 1, -1) * np.where(rng.random(n) < 0.1, -1, 1)
        with open(root / name, "w") as f:
            for row, label in zip(x, y):
                f.write(f"{int(label):+d} " + " ".join(f"{j + 1}:{v:.4g}" for j, v in enumerate(row)) + "\n")
    return root


def goal_row(optimizer: str, options: dict[str, str], *, workers: int, network, data_dir: str,
             max_epochs: int) -> dict:
    """One run's figures: its state (and why, if it did not finish), whether it reached the goal,
    the training seconds, epochs and steps to it, the best accuracy and the KB sent per step."""
    from mlbench.launch.plan import RunRequest
    from mlbench.launch.registry import choose
    from mlbench.results.store import RunStore

    store = RunStore()
    launcher = choose(store, {})
    run = launcher.create(RunRequest(task="task2a", workers=workers, data_dir=data_dir, light=True,
                                     optimizer=optimizer, optimizer_options=options, network=network,
                                     overrides={"max_epochs": max_epochs}))
    final = launcher.run_attached(run)
    result = final.result or {}
    return {"state": final.state, "reason": final.reason, "reached": bool(result.get("reached")),
            "seconds": result.get("time_to_accuracy"), "epochs": result.get("epochs_to_accuracy"),
            "steps": result.get("steps_to_accuracy"), "best": result.get("best_accuracy") or 0.0,
            "kb_sent": (result.get("bytes_sent") or 0) / max(1, result.get("steps") or 1) / 1e3}


def _row(label: str, runs: list[dict], reference: list[dict], max_epochs: int) -> list[str]:
    """A case's rounds as one row; the ratio to the reference from the rounds where both reached."""
    failed = next((r for r in runs if r["state"] != "finished"), None)
    if failed:   # a run that did not finish: say how
        return [label, f"{failed['state']}: {failed['reason']}", "", "", "", "", ""]
    reached = [r for r in runs if r["reached"]]
    kb = f"{statistics.median(r['kb_sent'] for r in runs):,.2f}"
    if not reached:
        best = max(r["best"] for r in runs)
        return [label, f"0/{len(runs)}", f"not reached in {max_epochs} epochs (best {best:.2%})", "-", "-", "-", kb]
    pairs = [(r["seconds"], ref["seconds"]) for r, ref in zip(runs, reference, strict=True)
             if r["reached"] and ref["state"] == "finished" and ref["reached"]]
    if runs is reference:
        versus = "1.00x"
    else:
        versus = ratio_spread([mine for mine, _ in pairs], [ref for _, ref in pairs]) if pairs else "-"
    return [label, f"{len(reached)}/{len(runs)}", spread([r["seconds"] for r in reached], "{:.2f}"), versus,
            spread([r["epochs"] for r in reached], "{:.2f}"), spread([float(r["steps"]) for r in reached], "{:.0f}"),
            kb]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bandwidth", default="10gbit,1gbit,100mbit", help="rates, comma-separated (tc units)")
    parser.add_argument("--latency", default="0.5ms", help="one-way latency between workers")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--features", type=int, default=2000, help="epsilon has 2,000")
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--max-epochs", type=int, default=10)
    parser.add_argument("--plugin", action="append", default=[], metavar="'SPEC KEY=VALUE ...'",
                        help="also an optimizer plug-in with its options (repeatable)")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="interleaved rounds [5]")
    args = parser.parse_args()
    networks = shaped_networks(args.bandwidth, args.latency, "goal_network.py")
    home = bench_home()
    data_dir = str(write_data(Path(tempfile.mkdtemp(prefix="mlbench-libsvm-", dir=home)), args.features,
                              args.samples))
    cases = CASES + [_plugin_case(p) for p in args.plugin]
    print(machine_line(f"{cpu_model()}, {usable_cores()} cores | torch {torch.__version__} | task2a light goal "
                       f"(80%), logistic regression on {args.samples:,} generated samples x {args.features:,} "
                       f"features, {args.workers} workers, cpu/gloo, emulated network: "
                       f"{', '.join(n.label() for n in networks)} | {args.repeats} interleaved rounds; median (range)"),
          flush=True)
    plan = {}   # one round: every network's optimizers, in this order
    for network in networks:
        for label, optimizer, options in cases:
            plan[(network, label)] = _announced(f"{network.label()}: {label}", functools.partial(
                goal_row, optimizer, options, workers=args.workers, network=network, data_dir=data_dir,
                max_epochs=args.max_epochs), args.repeats)
    rounds = interleave(plan, args.repeats)
    for network in networks:
        reference = rounds[(network, cases[0][0])]
        rows = [_row(label, rounds[(network, label)], reference, args.max_epochs) for label, *_ in cases]
        print(f"\n{network.label()}:\n" + tabulate(
            rows, headers=["optimizer", "reached", "s to 80%", f"vs {cases[0][0]}", "epochs", "steps",
                           "KB sent/step/worker"], tablefmt="github", disable_numparse=True), flush=True)


if __name__ == "__main__":
    main()

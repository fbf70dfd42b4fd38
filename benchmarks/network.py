"""The optimizers of task 1a on an emulated network: at which bandwidth does compression pay?

    python benchmarks/network.py                           # 10gbit, 1gbit, 100mbit at 0.5 ms, 2 workers
    python benchmarks/network.py --latency 0               # where the kernel has no netem
    python benchmarks/network.py --bandwidth 1gbit --only powersgd
    python benchmarks/network.py --only centralized-sgd model-averaging powersgd --plugin "diloco H=10"
    python benchmarks/network.py --bandwidth 1gbit --only centralized-sgd --steps 2 --interval 1 --repeats 2

For every bandwidth, the table of benchmarks/optimizers.py (ms/step, communication ms/step,
bytes sent per step and worker) for the reference and the compressing optimizers, every row a
real `mlbench run task1a K --bandwidth B --latency L --optimizer ...` through the launcher, and
as the baseline the PyTorch DDP tutorial loop started in the same emulated network (each of its
processes in its own namespace, gloo on the namespace's link). Then, per optimizer, its step time
relative to the reference at each bandwidth, and the highest bandwidth at which it is faster: the
crossover. Every case (each bandwidth's baseline and optimizers) runs once per round, ``--repeats``
rounds (benchmarks/measure.py); times are the median (fastest-slowest) and every ratio is taken
round by round, so a change of the host's load hits both sides of it.

``--plugin "SPEC KEY=VALUE ..."`` adds a row for an optimizer plug-in (docs/plugins.md: a file, a
module or an installed entry point such as examples/diloco's ``diloco``), run the same way.

The runs train on random images in the CIFAR-10 layout (10,000 train, 200 test): what is timed
is the same as with --data synthetic, but the evaluation that ends every run costs nothing.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import DEFAULT_REPEATS, interleave, machine_line, ratio_spread, spread
from optimizers import _plain_ddp_worker, mlbench_row, plain_ddp_bytes

from mlbench.errors import MlbenchError
from mlbench.network.emulation import LocalNetwork, check_local_shaping
from mlbench.network.settings import NetworkSettings, format_rate, network_options
from mlbench.results.environment import cpu_model, usable_cores

REFERENCE = "centralized-sgd (reference)"
CASES = [
    (REFERENCE, "centralized-sgd", {}),
    ("model-averaging", "model-averaging", {}),
    ("model-averaging period=4", "model-averaging", {"period": "4"}),
    ("powersgd rank=2", "powersgd", {"rank": "2"}),
    ("signsgd", "signsgd", {}),
    ("sparsified-sgd topk 1%", "sparsified-sgd", {}),
    ("ddp", "ddp", {}),
    ("ddp hook=fp16", "ddp", {"hook": "fp16"}),
    ("ddp hook=powersgd rank=2", "ddp", {"hook": "powersgd"}),
]
PLAIN = "plain PyTorch DDP (tutorial loop)"


def write_random_cifar(root: Path, train: int = 10_000, test: int = 200) -> Path:
    """Random uint8 images and labels in the official python layout (cifar-10-batches-py)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    parts = [(f"data_batch_{i + 1}", train // 5) for i in range(5)] + [("test_batch", test)]
    for name, n in parts:
        with open(folder / name, "wb") as f:
            pickle.dump({"batch_label": name, "labels": rng.integers(0, 10, n).tolist(),
                         "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                         "filenames": [f"{i}.png" for i in range(n)]}, f, protocol=4)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [str(i) for i in range(10)], "num_cases_per_batch": train // 5,
                     "num_vis": 3072}, f, protocol=4)
    return root


class _Print:
    """What _plain_ddp_worker's rank 0 reports, as a JSON line on stdout."""

    def put(self, value: float) -> None:
        print(json.dumps({"seconds_per_step": value}), flush=True)


def plain_ddp_row(network: NetworkSettings, *, workers: int, steps: int, warmup: int, log: Path) -> list:
    """The DDP tutorial loop, each process in its own namespace of the same emulated network."""
    net = LocalNetwork(network, workers, log)
    net.start()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        args = [str(workers), store, str(steps), str(warmup)]
        procs = [subprocess.Popen(net.worker_command(rank, [sys.executable, __file__, "--plain-worker", str(rank),
                                                             *args]),
                                  env={**os.environ, **net.worker_env(rank)}, stdout=subprocess.PIPE, text=True)
                 for rank in range(workers)]
        try:
            out = procs[0].communicate(timeout=1800)[0]
            for proc in procs[1:]:
                proc.wait(timeout=60)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
            net.stop()
    if any(p.returncode for p in procs):   # a row that says so: the other rounds' figures are kept
        return [PLAIN, f"failed: worker exit codes {[p.returncode for p in procs]}", "", "", "", ""]
    per_step = json.loads(out.strip().splitlines()[-1])["seconds_per_step"]
    sent, dense = plain_ddp_bytes(workers)
    return [PLAIN, per_step * 1e3, "-", sent / 1e3, dense / sent]


def _plain_worker_main(argv: list[str]) -> None:
    rank, workers, store, steps, warmup = int(argv[0]), int(argv[1]), argv[2], int(argv[3]), int(argv[4])
    _plain_ddp_worker(rank, workers, store, "cpu", "gloo", steps, warmup, _Print())


def shaped_networks(bandwidth: str, latency: str, script: str) -> list:
    """The emulated networks to measure (``--bandwidth``, ``--latency``), or the script's exit
    with the reason this machine cannot shape them."""
    try:
        networks = network_options(bandwidth, latency, None, None)
        check_local_shaping(networks[0])
    except MlbenchError as err:
        sys.exit(f"benchmarks/{script}: {err}")
    return networks


def bench_home() -> Path:
    """The run store of the benchmark: ``MLBENCH_HOME``, else a fresh folder (setdefault would
    make the folder even when one is given, and leave it)."""
    home = Path(os.environ.get("MLBENCH_HOME") or tempfile.mkdtemp(prefix="mlbench-bench-"))
    os.environ["MLBENCH_HOME"] = str(home)
    home.mkdir(parents=True, exist_ok=True)
    return home


def _plugin_case(text: str) -> tuple[str, str, dict[str, str]]:
    """``"SPEC KEY=VALUE ..."`` as a row of CASES, labelled as given."""
    spec, *pairs = text.split()
    return text, spec, dict(pair.split("=", 1) for pair in pairs)


def _ms(rows: list[list]) -> list[float] | None:
    """A case's ms/step per round, or None when a round of it did not finish."""
    values = [r[1] for r in rows]
    return None if any(isinstance(v, str) for v in values) else values


def _versus(mine: list[list], base: list[list]) -> str:
    """``mine / base`` as a median and range of the per-round ratios; "-" where a round failed."""
    a, b = _ms(mine), _ms(base)
    return "-" if a is None or b is None else ratio_spread(a, b)


def _wins(mine: list[list], base: list[list]) -> bool:
    """Faster than ``base``: the median of the per-round ratios is below 1."""
    a, b = _ms(mine), _ms(base)
    return a is not None and b is not None and statistics.median(x / y for x, y in zip(a, b, strict=True)) < 1


def crossover(results: dict[float, dict[str, list[list]]], cases: list[tuple[str, str, dict[str, str]]]
              ) -> list[list[str]]:
    """Per optimizer: its step time / the reference's at each bandwidth (median of the rounds'
    ratios, and their range), and where it starts to win (a median ratio below 1)."""
    rates = sorted(results, reverse=True)
    rows = []
    for label, *_ in cases[1:]:
        winning = [rate for rate in rates if _wins(results[rate][label], results[rate][REFERENCE])]
        if not winning:
            start = "at none of these rates"
        elif all(r in winning for r in rates if r <= max(winning)):
            start = f"at {format_rate(max(winning))} and below"
        else:
            start = "at " + ", ".join(format_rate(r) for r in winning)
        rows.append([label, *(_versus(results[rate][label], results[rate][REFERENCE]) for rate in rates), start])
    return rows


def _table(rounds: dict[str, list[list]]) -> str:
    """One bandwidth's table: per case the median (range) of ms/step and communication ms/step,
    its ratio to the plain loop of the same round, and the bytes (the same every round)."""
    table = []
    for label, rows in rounds.items():
        failed = next((r for r in rows if isinstance(r[1], str)), None)
        if failed:   # a run that did not finish: say how
            table.append(failed)
            continue
        comm = [r[2] for r in rows if not isinstance(r[2], str)]
        versus = "1.00x" if label == PLAIN else _versus(rows, rounds[PLAIN])
        table.append([label, spread([r[1] for r in rows], "{:.1f}"), versus,
                      spread(comm, "{:.1f}") if comm else "-", f"{statistics.median(r[3] for r in rows):,.1f}",
                      f"{statistics.median(r[4] for r in rows):.1f}x"])
    return tabulate(table, headers=["optimizer", "ms/step", "vs plain DDP", "comm ms/step", "KB sent/step/worker",
                                    "fewer bytes than all-reduce"], tablefmt="github", disable_numparse=True)


def _announced(name: str, measure, repeats: int):
    """``measure`` that says on stderr when it is done, with its round (a round takes minutes)."""
    done = 0

    def run():
        nonlocal done
        row = measure()
        done += 1
        print(f"  done: round {done}/{repeats}: {name}", file=sys.stderr, flush=True)
        return row
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bandwidth", default="10gbit,1gbit,100mbit", help="rates, comma-separated (tc units)")
    parser.add_argument("--latency", default="0.5ms", help="one-way latency between workers")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40, help="timed steps per run (after one interval of warm-up)")
    parser.add_argument("--interval", type=int, default=10, help="logging interval; the first is warm-up")
    parser.add_argument("--only", nargs="*", help="optimizer names to run (default: all)")
    parser.add_argument("--plugin", action="append", default=[], metavar="'SPEC KEY=VALUE ...'",
                        help="also an optimizer plug-in with its options (repeatable)")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="interleaved rounds [5]")
    args = parser.parse_args()
    cases = [case for case in CASES if not args.only or case[1] in args.only] + [_plugin_case(p) for p in args.plugin]
    networks = shaped_networks(args.bandwidth, args.latency, "network.py")
    home = bench_home()
    data_dir = str(write_random_cifar(Path(tempfile.mkdtemp(prefix="mlbench-cifar-", dir=home))))
    print(machine_line(f"{cpu_model()}, {usable_cores()} cores | torch {torch.__version__} | task1a ResNet-20, "
                       f"batch 32 per worker, {args.workers} workers, cpu/gloo, {args.steps} timed steps, emulated "
                       f"network: {', '.join(n.label() for n in networks)} | {args.repeats} interleaved rounds; "
                       f"median (range)"), flush=True)
    plan = {}   # one round: every network's baseline and optimizers, in this order
    for network in networks:
        runs = {PLAIN: functools.partial(plain_ddp_row, network, workers=args.workers, steps=args.steps,
                                         warmup=args.interval, log=home / "plain-network.log")}
        for label, optimizer, options in cases:
            runs[label] = functools.partial(mlbench_row, label, optimizer, options, workers=args.workers,
                                            steps=args.steps, interval=args.interval, device="cpu", backend="gloo",
                                            network=network, data_dir=data_dir)
        for label, measure in runs.items():
            plan[(network, label)] = _announced(f"{network.label()}: {label}", measure, args.repeats)
    rounds = interleave(plan, args.repeats)
    results: dict[float, dict[str, list[list]]] = {}
    for network in networks:
        results[network.bandwidth_bps] = {label: rounds[(network, label)] for label in [PLAIN, *(c[0] for c in cases)]}
        print(f"\n{network.label()}:\n{_table(results[network.bandwidth_bps])}", flush=True)
    if len(results) > 1 and cases[0][0] == REFERENCE:
        print("\nStep time relative to the reference, median of the rounds' ratios (below 1.00x: faster), "
              "and where each starts to win:")
        rates = [format_rate(r) for r in sorted(results, reverse=True)]
        print(tabulate(crossover(results, cases), headers=["optimizer", *rates, "faster than the reference"],
                       tablefmt="github", disable_numparse=True))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--plain-worker"]:
        _plain_worker_main(sys.argv[2:])
    else:
        main()

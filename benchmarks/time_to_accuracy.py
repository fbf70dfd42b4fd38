"""Time to accuracy of task 1a on one device: mlbench's run vs a plain PyTorch training script.

    python benchmarks/time_to_accuracy.py --data-dir DIR [--goal 0.8] [--limit 600]

Both train ResNet-20 v1 with the closed-division hyper-parameters for one worker (batch 32,
learning rate 0.1/256*32 = 0.0125, Nesterov momentum 0.9, weight decay 1e-4, crop + flip
augmentation) on the real CIFAR-10 in DIR and evaluate the whole test set after every epoch until
the goal. mlbench is launched as a user launches it (a worker process through the local
launcher; data loading included in the wall time). The plain script is what the PyTorch
tutorials write: torchvision transforms in a DataLoader with worker processes, autograd and
torch.optim.SGD.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from measure import DEFAULT_REPEATS, interleave, machine_line, spread

from mlbench.launch.plan import RunRequest
from mlbench.launch.registry import choose
from mlbench.results.store import RunStore
from mlbench.tasks.data.augment import CIFAR10_MEAN, CIFAR10_STD
from mlbench.tasks.data.cifar10 import load_cifar10
from mlbench.tasks.models import build_model


def run_mlbench(data_dir: str, goal: float, timing: bool, extra: dict) -> dict:
    started = time.perf_counter()
    store = RunStore()
    launcher = choose(store, {})  # this machine's processes, as `mlbench run`
    overrides = {"goal_full": goal} if goal != 0.8 else {}
    run = launcher.create(RunRequest(task="task1a", workers=1, data_dir=data_dir, overrides=overrides,
                                     timing=timing, log_every=500, **extra))
    final = launcher.run_attached(run)
    wall = time.perf_counter() - started
    result = final.result or {}
    return {"wall": wall, "tta": result.get("time_to_accuracy"), "epochs": result.get("epochs_to_accuracy"),
            "accuracy": result.get("final_accuracy"), "reached": result.get("reached"), "state": final.state}


def run_plain(data_dir: str, goal: float, limit: float, device: torch.device) -> dict:
    """The tutorial script, timed from its first line (data loading included)."""
    import torchvision.transforms.v2 as T
    from torch.utils.data import DataLoader, Dataset

    started = time.perf_counter()
    train, test = load_cifar10(data_dir)

    class Images(Dataset):
        def __init__(self, split, transform):
            self.x, self.y, self.transform = split.x, split.y, transform

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            return self.transform(self.x[i]), self.y[i]

    norm = [T.ToDtype(torch.float32, scale=True), T.Normalize(CIFAR10_MEAN, CIFAR10_STD)]
    train_loader = DataLoader(Images(train, T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), *norm])),
                              batch_size=32, shuffle=True, num_workers=min(8, os.cpu_count() or 1),
                              pin_memory=True, drop_last=True, persistent_workers=True)
    test_loader = DataLoader(Images(test, T.Compose(norm)), batch_size=1000, num_workers=2)
    torch.manual_seed(0)
    model = build_model("resnet20-v1").to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 / 256 * 32, momentum=0.9, nesterov=True, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    train_time = 0.0
    for epoch in range(1, 165):
        model.train()
        t0 = time.perf_counter()
        for x, y in train_loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        train_time += time.perf_counter() - t0
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in test_loader:
                correct += (model(x.to(device)).argmax(1) == y.to(device)).sum().item()
        accuracy = correct / len(test.y)
        if accuracy >= goal or time.perf_counter() - started > limit:
            return {"wall": time.perf_counter() - started, "tta": train_time if accuracy >= goal else None,
                    "epochs": epoch, "accuracy": accuracy, "reached": accuracy >= goal, "state": "finished"}
    return {"wall": time.perf_counter() - started, "tta": None, "epochs": 164, "accuracy": accuracy,
            "reached": False, "state": "finished"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--goal", type=float, default=0.8)
    parser.add_argument("--limit", type=float, default=600, help="seconds for the plain script")
    parser.add_argument("--skip-plain", action="store_true")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="interleaved rounds [5]")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    cases = {"mlbench run task1a 1 (phase timing on)": lambda: run_mlbench(args.data_dir, args.goal, True, {}),
             "mlbench run task1a 1 --no-timing": lambda: run_mlbench(args.data_dir, args.goal, False, {})}
    if not args.skip_plain:
        cases["plain PyTorch (DataLoader, eager)"] = lambda: run_plain(args.data_dir, args.goal, args.limit, device)
    rounds = interleave(cases, args.repeats)
    print(machine_line(f"{torch.cuda.get_device_name() if cuda else 'CPU'} | torch {torch.__version__} | "
                       f"goal {args.goal:.0%} | {args.repeats} interleaved rounds; median (range)"))
    rows = []
    for label, results in rounds.items():
        reached = [r for r in results if r["reached"]]
        rows.append([label, f"{len(reached)}/{len(results)}", spread([r["wall"] for r in results], "{:.1f}"),
                     spread([r["tta"] for r in reached], "{:.1f}") if reached else "-",
                     spread([float(r["epochs"]) for r in reached], "{:.0f}") if reached else "-",
                     spread([r["accuracy"] for r in results if r["accuracy"] is not None], "{:.4f}")])
    print(tabulate(rows, headers=["run", "goal reached", "wall s (from launch)", "train s to goal",
                                  "epochs", "final accuracy"], tablefmt="github"))


def _fmt(value, digits: int = 1):
    return "-" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    main()

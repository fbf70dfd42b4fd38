"""`mlbench run task5a` end to end: two real workers on shards this test writes, every surface.

A CPU-sized GPT-2 (2 layers, width 64, context 64: open division) trains twice on 2 workers, once
with the reference (centralized-adamw) and once fully sharded (fsdp). The run's output, `status`,
`status -o json`, `compare` and the MLLOG (MLPerf's own checker) speak of validation loss, lower
is better, and of time to goal, never of accuracy; both runs report their peak memory per worker;
the two compute the same steps, so their validation losses agree; fsdp's saved model is whole.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from tests.gpt.tiny import TINY, write_tiny_shards
from tests.helpers import mlbench


@pytest.fixture
def shards(tmp_path):
    return write_tiny_shards(tmp_path / "shards")


def test_settings_that_do_not_fit_the_workers_are_refused_in_one_line_before_a_run_exists():
    proc = mlbench("run", "task5a", "3", *TINY, "--data", "synthetic")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "Error: task5a on 3 workers: a global batch of 8 sequences is not a whole number of micro-batches of 2 "
        "sequences on each of 3 workers: set global_batch to a multiple of 6, or batch_per_worker so that "
        "batch_per_worker x 3 divides it"]
    assert json.loads(mlbench("status", "-o", "json", check=True).stdout)["runs"] == []


def test_two_workers_train_and_every_surface_speaks_of_validation_loss(shards, tmp_path):
    ran = {}
    for optimizer in ("centralized-adamw", "fsdp"):
        proc = mlbench("run", "task5a", "2", *TINY, "--optimizer", optimizer, "--data-dir", str(shards),
                       "--save-model", check=True, timeout=600)
        out = proc.stdout
        assert "goal validation loss <= 3.2800" in out and re.search(r"epoch\s+2\.00\s+validation loss \d\.\d{4}", out)
        assert "Goal validation loss <= 3.2800 not reached (max-epochs): " in out, out
        assert "accuracy" not in out.lower(), out
        ran[optimizer] = re.search(r"Details: mlbench status ([0-9a-f]+)", out).group(1)

    for optimizer, run_id in ran.items():
        shown = mlbench("status", run_id, check=True).stdout
        assert re.search(r"last validation loss\s+\d\.\d{4} \(epoch 2\.00\)", shown), shown
        assert "test loss" not in shown and "accuracy" not in shown.lower(), shown
        assert re.search(r"peak memory\s+[\d.]+ [MG]B resident \(largest rank\)", shown), shown
        assert re.search(r"throughput\s+[\d,]+ tokens/s", shown), shown
        assert re.search(rf"optimizer\s+{optimizer}\n", shown), shown

    documents = {r["optimizer"]: r for r in json.loads(mlbench("status", "-o", "json", check=True).stdout)["runs"]}
    losses = {name: documents[name]["metric_value"] for name in ran}
    assert (documents["fsdp"]["metric"], documents["fsdp"]["metric_title"]) == ("val_loss", "validation loss")
    # the same 20 steps of the same data: sharding changes the summation order, nothing else
    assert abs(losses["fsdp"] - losses["centralized-adamw"]) < 1e-4, losses

    compared = mlbench("compare", *ran.values(), check=True).stdout
    assert compared.count("goal validation loss <= 3.2800 | speedup of time to goal") == 2, compared
    assert "Time to goal: training time to the goal" in compared and "accuracy" not in compared.lower(), compared
    assert re.search(r"\| centralized-adamw \|", compared) and re.search(r"\| fsdp \|", compared), compared

    for run_id in ran.values():
        log = tmp_path / f"{run_id}.zip"
        checked = mlbench("download", run_id, "-o", str(log), "--format", "mlperf", "--check", check=True)
        assert "MLPerf's compliance checker passes" in checked.stdout, checked.stdout + checked.stderr
        lines = [json.loads(line.removeprefix(":::MLLOG "))
                 for line in log.with_suffix(".mllog.txt").read_text().splitlines()]
        keys = {e["key"]: e for e in lines}
        assert (keys["global_batch_size"]["value"], keys["gradient_accumulation_steps"]["value"]) == (8, 2)
        assert keys["eval_accuracy"]["metadata"]["metric"] == "val_loss"

    from mlbench.results.store import RunStore

    saved = torch.load(RunStore().get(ran["fsdp"]).run_dir / "checkpoints" / "rank-1.pt", weights_only=True)
    assert saved["wte.weight"].shape == (50_304, 64) and type(saved["wte.weight"]) is torch.Tensor


def test_torchrun_starts_task_5a_fully_sharded_as_a_user_would(shards):
    """A `--record-only` run whose two workers torchrun starts (docs/slurm-and-torchrun.md)."""
    import subprocess

    from mlbench.results.store import RunStore
    from tests.test_launcher_matrix import torchrun

    recorded = mlbench("run", "task5a", "2", *TINY, "--optimizer", "fsdp", "--data-dir", str(shards), "--record-only",
                       check=True)
    run = RunStore().get(recorded.stdout.split("Recorded run ")[1].split()[0])
    workers = subprocess.run([*torchrun(), "--standalone", "--nproc-per-node", "2", "-m", "mlbench.worker",
                              str(run.run_dir)], capture_output=True, text=True, timeout=600)
    assert workers.returncode == 0, workers.stdout[-2000:] + workers.stderr[-2000:]
    shown = mlbench("status", run.id, check=True).stdout
    assert re.search(r"state\s+finished", shown) and re.search(r"last validation loss\s+\d\.\d{4}", shown), shown
    assert re.search(r"optimizer\s+fsdp\n", shown), shown

"""Task 5a on a real one-node Slurm cluster: the CPU-sized GPT-2 (tests/gpt/tiny.py) on two Slurm
tasks computes what two local workers compute, bit for bit, and every surface speaks of its
validation loss."""

from __future__ import annotations

import json

import pytest
import torch

from tests.gpt.tiny import TINY, write_tiny_shards
from tests.helpers import checkpoint, last_run, mlbench, run_json


@pytest.mark.timeout(900)
def test_a_task_5a_run_on_two_slurm_tasks_equals_the_local_run(slurm, tmp_path):
    shards = write_tiny_shards(tmp_path / "shards")
    args = ("run", "task5a", "2", *TINY, "--data-dir", str(shards), "--save-model")
    mlbench(*args, check=True, timeout=600)
    local = last_run()
    proc = mlbench(*args, "--slurm", "--partition", "debug", "--time", "00:10:00", check=True, timeout=600)
    run = last_run()
    assert run.id != local.id and run.launcher == "slurm" and run.state == "finished", run.reason
    assert f"Submitted Slurm job {run_json(run)['slurm']['job_id']} (2 task(s))" in proc.stdout
    assert "validation loss" in proc.stdout and "accuracy" not in proc.stdout.lower(), proc.stdout
    listed = {r["id"]: r for r in json.loads(mlbench("status", "-o", "json", check=True).stdout)["runs"]}
    assert listed[run.id]["metric"] == "val_loss" and listed[run.id]["launcher"] == "slurm"
    assert listed[run.id]["metric_value"] == listed[local.id]["metric_value"]
    assert run.result["steps"] == local.result["steps"] == 20
    for rank in (0, 1):
        mine, theirs = checkpoint(run, rank), checkpoint(local, rank)
        assert mine.keys() == theirs.keys()
        for name, value in mine.items():
            assert torch.equal(value, theirs[name]), (rank, name)

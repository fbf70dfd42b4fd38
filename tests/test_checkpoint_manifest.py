"""Checkpoints are verified before a run goes on from them (mlbench.results.checkpoints): each
checkpoint's manifest, written last, names every rank's file with its size and SHA-256; a resume
skips a newer checkpoint whose files do not match it, in one line naming it, sets it aside and
goes on from the newest valid one, to the parameters of the uninterrupted run.
"""

from __future__ import annotations

import json

import torch

from mlbench.results.checkpoints import (
    CHECKPOINT_MANIFEST,
    complete_checkpoints,
    file_digest,
    newest_valid,
    rank_file,
    state_dir,
)
from mlbench.results.store import RunStore
from mlbench.worker import checkpoint
from tests.helpers import mlbench, run_json


def _write(root, step):
    return checkpoint.write(root, 0, 1, {"format": checkpoint.FORMAT, "step": step, "seed": 1, "workers": 1,
                                         "weights": torch.arange(1000, dtype=torch.float32) * step})


def test_each_checkpoint_has_a_manifest_of_its_files_and_a_damaged_one_is_not_valid(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        _write(root, step)
    assert complete_checkpoints(root, 1).steps == (2, 3)     # the two newest are kept
    manifest = json.loads((state_dir(root, 3) / CHECKPOINT_MANIFEST).read_text())
    assert manifest == {"step": 3, "workers": 1, "files": {"rank-0.pt": file_digest(rank_file(root, 3, 0))}}
    assert newest_valid(root, 1) == (3, [])

    newest = rank_file(root, 3, 0)
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x01    # one bit, the size unchanged
    newest.write_bytes(bytes(data))
    step, rejected = newest_valid(root, 1)
    assert step == 2 and [(r.step, r.reason) for r in rejected] == [
        (3, "rank-0.pt's SHA-256 is not its manifest's (it changed after it was written)")]

    newest.write_bytes(bytes(data[:100]))
    step, rejected = newest_valid(root, 1)
    assert step == 2 and rejected[0].reason == \
        f"rank-0.pt is 100 bytes, its manifest says {len(data):,} (truncated or replaced)"
    rank_file(root, 2, 0).unlink()
    assert newest_valid(root, 1)[0] is None


def test_a_resume_skips_a_truncated_newest_checkpoint_and_ends_as_the_uninterrupted_run(libsvm_dir):
    run = ("task2a", "2", "--data-dir", str(libsvm_dir), "--set", "batch_per_worker=50", "--log-every", "1",
           "--save-model")
    mlbench("run", *run, "--max-steps", "6", "--checkpoint-every", "2steps", check=True)
    stopped = RunStore().list()[-1]
    root = stopped.run_dir / "checkpoints"
    assert complete_checkpoints(root, 2).steps == (4, 6)
    torn = rank_file(root, 6, 1)
    size = torn.stat().st_size
    torn.write_bytes(torn.read_bytes()[: size // 2])

    proc = mlbench("resume", stopped.id, "--max-steps", "8")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = (f"mlbench: the checkpoint of step 6 ({root / 'rejected-step-6'}) is skipped: rank-1.pt is "
            f"{size // 2:,} bytes, its manifest says {size:,} (truncated or replaced); going on from step 4")
    assert line in proc.stderr.splitlines(), proc.stderr
    assert "from step 4" in proc.stdout
    resumed = RunStore().get(stopped.id)
    assert resumed.state == "finished" and resumed.result["steps"] == 8
    document = run_json(resumed)
    assert document["config"]["resume_step"] == 4
    assert [(r["step"], r["folder"]) for r in document["rejected_checkpoints"]] == \
        [(6, str(root / "rejected-step-6"))]
    assert (root / "rejected-step-6" / "rank-1.pt").stat().st_size == size // 2   # kept to look at

    mlbench("run", *run, "--max-steps", "8", check=True)
    reference = RunStore().list()[-1]
    for rank in range(2):
        expected = torch.load(reference.run_dir / "checkpoints" / f"rank-{rank}.pt", weights_only=True)
        actual = torch.load(resumed.run_dir / "checkpoints" / f"rank-{rank}.pt", weights_only=True)
        assert all(torch.equal(expected[name], actual[name]) for name in expected), rank

"""An optimizer plug-in written outside the repository runs under Slurm (issue 22): every worker
that srun starts executes the run folder's copy, and the run names its source's SHA-256."""

from __future__ import annotations

import hashlib
import json
import textwrap
from pathlib import Path

from tests.helpers import last_run, mlbench, run_json

PLUGIN = '''
import torch

from mlbench.optim.base import DistributedOptimizer, all_reduce_mean_, allreduce_bytes
from mlbench.optim.descriptors import Option, OptimizerInfo


class AveragedSGD(DistributedOptimizer):
    info = OptimizerInfo(name="averaged-sgd", reference="a test", summary="all-reduce, then plain SGD",
                         options={"lr_scale": Option("the step's share", 1.0, kind="float", minimum=0.0)},
                         exact=True)

    def __init__(self, ctx):
        super().__init__(ctx)
        print(f"averaged-sgd on rank {ctx.rank} from {__file__}", flush=True)

    @torch.no_grad()
    def step(self, lr):
        for p in self.params:
            all_reduce_mean_(p.grad, self.ctx.world_size, self.ctx.group)
            self.bytes_sent += allreduce_bytes(p.numel(), p.element_size(), self.ctx.world_size)
            p.add_(p.grad, alpha=-lr * self.opts["lr_scale"])
'''


def test_a_plugin_from_outside_the_repository_runs_on_two_slurm_workers_with_its_hash_recorded(
        slurm, libsvm_dir, tmp_path):
    plugin = tmp_path / "averaged_sgd.py"
    plugin.write_text(textwrap.dedent(PLUGIN))
    sha = hashlib.sha256(plugin.read_bytes()).hexdigest()
    mlbench("run", "task2a", "2", "--data-dir", str(libsvm_dir), "--max-steps", "4", "--log-every", "2",
            "--set", "batch_per_worker=50", "--optimizer", f"{plugin}:AveragedSGD", "--opt", "lr_scale=0.5",
            "--slurm", "--partition", "debug", "--time", "00:10:00", check=True, timeout=300)
    run = last_run()
    assert (run.state, run.launcher, run.optimizer) == ("finished", "slurm", f"averaged-sgd@{sha[:12]}")
    record = run_json(run)["config"]["optimizer_plugin"]
    assert (record["sha256"], record["file"], record["options"]) == \
        (sha, "plugin/averaged_sgd/averaged_sgd.py", {"lr_scale": 0.5})
    assert (Path(run.run_dir) / record["file"]).read_bytes() == plugin.read_bytes()
    details = mlbench("status", run.id, check=True).stdout
    assert f"averaged-sgd, sha256 {sha[:12]} ({plugin}:AveragedSGD, kept as plugin/averaged_sgd/averaged_sgd.py)" \
        in details
    listed = json.loads(mlbench("status", "-o", "json", check=True).stdout)["runs"]
    assert f"optimizer=averaged-sgd@{sha[:12]}" in listed[0]["open_reasons"]
    doc = json.loads(mlbench("status", run.id, "-o", "json", check=True).stdout)
    assert doc["optimizer_plugin"]["sha256"] == sha and doc["summary"]["steps"] == 4
    # every rank that srun started made the plug-in from the run folder's copy, not from the user's file
    copy = Path(run.run_dir) / "plugin" / "averaged_sgd" / "averaged_sgd.py"
    for rank in (0, 1):
        log = (Path(run.run_dir) / "logs" / f"rank-{rank}.log").read_text()
        assert f"averaged-sgd on rank {rank} from {copy}" in log

"""`mlbench run TASK K --optimizer A,B,C --bandwidth R1,R2`: each optimizer at each rate, one group,
and `compare`/`charts` show time to goal and bytes per step against the bandwidth, a line per
optimizer. Real workers in their own network namespaces, shaped by tc."""

from __future__ import annotations

import json

from mlbench.results.store import RunStore
from tests.helpers import mlbench

MBIT = 10**6
OPTIMIZERS = ("centralized-sgd", "diloco", "streaming-diloco")


def test_one_command_runs_every_optimizer_at_every_bandwidth_as_one_group(shaping, libsvm_dir, tmp_path):
    proc = mlbench("run", "task2a", "2", "--data-dir", str(libsvm_dir), "--max-steps", "24", "--optimizer",
                   ",".join(OPTIMIZERS), "--bandwidth", "10mbit,1gbit", "--opt", "H=4", check=True, timeout=600)
    runs = RunStore().list()
    assert len(runs) == 6 and len({r.group_id for r in runs}) == 1, proc.stdout
    documents = [json.loads((r.run_dir / "run.json").read_text()) for r in runs]
    planned = {(d["config"]["optimizer"], d["network"]["bandwidth_bps"]) for d in documents}
    assert planned == {(o, rate * MBIT) for o in OPTIMIZERS for rate in (10, 1000)}
    options = {d["config"]["optimizer"]: d["config"]["optimizer_options"] for d in documents}
    # --opt H=4 reaches the optimizers that have an H, and only them
    assert options == {"centralized-sgd": {}, "diloco": {"H": "4"}, "streaming-diloco": {"H": "4"}}
    assert f"mlbench compare --group {runs[0].group_id}" in proc.stdout

    table = mlbench("compare", "--group", runs[0].group_id, check=True).stdout
    assert "optimizer (centralized-sgd | centralized-sgd | diloco" in table
    assert "each optimizer's own options (in its heading)" in table
    matrix = table[table.index("By bandwidth"):].splitlines()
    assert "TIME TO GOAL 10 Mbit/s" in matrix[1] and "TIME TO GOAL 1 Gbit/s" in matrix[1] and "BYTES/STEP" in matrix[1]
    rows = {line.split()[0]: line for line in matrix[3:6]}
    assert set(rows) == set(OPTIMIZERS), matrix

    document = json.loads(mlbench("compare", "--group", runs[0].group_id, "-o", "json", check=True).stdout)
    per_step = {}
    for family in document["families"]:
        for group in family["groups"]:
            per_step.setdefault(family["optimizer"], set()).add(group["bytes_per_step"])
    # 40 fp32 weights: the reference all-reduces 160 B a step (2 (k-1)/k of it per worker); DiLoCo a
    # quarter of that (every H=4 steps) and Streaming DiLoCo the same on average, half of it every 2 steps
    assert per_step["centralized-sgd"] == {160.0}
    assert per_step["diloco"] == {40.0} and per_step["streaming-diloco"] == {40.0}, per_step

    charts = mlbench("charts", "--group", runs[0].group_id, "--out-dir", str(tmp_path), check=True)
    assert (tmp_path / "task2a-network.png").stat().st_size > 0, charts.stdout


def test_an_option_no_listed_optimizer_has_is_one_line(libsvm_dir):
    proc = mlbench("run", "task2a", "2", "--data-dir", str(libsvm_dir), "--optimizer", "centralized-sgd,diloco",
                   "--opt", "rank=2")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "Error: --opt rank: none of the optimizers centralized-sgd, diloco has this option (`mlbench optimizers` "
        "lists each one's)"]
    twice = mlbench("run", "task2a", "2", "--optimizer", "diloco,diloco")
    assert twice.returncode == 2 and "give each optimizer once" in twice.stderr

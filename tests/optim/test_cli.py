"""The optimizers from the command line: `mlbench optimizers`, wrong options, open-division runs."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from mlbench.cli import (
    cli,
    commands,  # noqa: F401  (registers the commands)
)
from mlbench.optim.descriptors import describe_optimizers
from mlbench.optim.catalog import OPTIMIZERS  # imports every optimizer module, which registers it
from mlbench.tasks.registry import reference_optimizers
from tests.helpers import events, last_run, mlbench, run_ids, run_json


def test_optimizers_lists_every_optimizer_with_its_options_defaults_and_paper():
    result = CliRunner().invoke(cli, ["optimizers"])
    assert result.exit_code == 0, result.output
    described = describe_optimizers(reference_optimizers())
    assert {d["name"] for d in described} == set(OPTIMIZERS) and len(described) == 13
    for info in described:
        assert f"{info['name']} (" in result.output
        assert info["reference"][:40] in result.output
        for option in info["options"]:
            assert f"--opt {option['name']}=" in result.output
    assert "centralized-sgd (closed division: the reference of task1a, task2a, task3a)" in result.output
    assert "centralized-adamw (closed division: the reference of task5a)" in result.output
    assert "Vogels" in result.output and "Bernstein" in result.output and "Stich" in result.output
    assert "Douillard" in result.output and "Sarfi" in result.output


@pytest.mark.parametrize("args,message", [
    (("--optimizer", "powersgd", "--opt", "rnak=2"), "has no option rnak; valid options: rank"),
    (("--optimizer", "powersgd", "--opt", "rank=0"), "rank=0: expected a value in [1, inf]"),
    (("--optimizer", "powersgd", "--opt", "rank=two"), "rank=two: expected an integer"),
    (("--optimizer", "signsgd", "--opt", "error_feedback=maybe"), "expected true or false"),
    (("--optimizer", "sparsified-sgd", "--opt", "method=best"), "expected one of topk, randomk"),
    (("--optimizer", "decentralized-sgd", "--opt", "topology=torus"), "factors as R x C"),
    (("--optimizer", "decentralized-sgd", "--opt", "topology=0-1"), "does not connect all 3 workers"),
    (("--optimizer", "ddp", "--opt", "hook=int8"), "expected one of allreduce, fp16, bf16, powersgd"),
    (("--optimizer", "streaming-diloco", "--opt", "H=5"), "H=5: it must be a multiple of fragments=2"),
    (("--optimizer", "streaming-diloco", "--opt", "overlap=5"), "overlap=5: it must be below H/fragments = 5"),
    (("--optimizer", "diloco", "--opt", "inner=lamb"), "expected one of adamw, sgd"),
    (("--optimizer", "diloco", "--opt", "inner=sgd", "--opt", "inner_lr_scale=1"),
     "option inner_lr_scale applies with inner=adamw only; with inner=sgd it changes nothing, leave it out"),
])
def test_wrong_optimizer_options_are_one_line_usage_errors_before_any_run(args, message):
    result = CliRunner().invoke(cli, ["run", "task1a", "3", "--data", "synthetic", *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
    assert run_ids() == []


def test_an_option_that_applies_to_nothing_is_left_out_of_what_a_run_records():
    """AdamW's options with the SGD inner loop change nothing a run computes: they are not in its
    options, so that runs given them and runs without them are one family."""
    from mlbench.optim.descriptors import INFO

    values = INFO["diloco"].parse_options({"inner": "sgd"}, 2)
    assert "inner_lr_scale" not in values and "inner_weight_decay" not in values and values["H"] == 10
    assert INFO["diloco"].parse_options({}, 2)["inner_lr_scale"] == 0.08
    read_back = INFO["diloco"].parse_options({"inner": "sgd", "inner_lr_scale": "1"}, None, strict=False)
    assert read_back == values


def test_open_division_runs_report_bytes_communication_and_compression(cifar_small_dir):
    """Real workers through the launcher: DDP (the trainer forwards through its wrapper), then
    gossip (evaluation on the average model, then each rank's own model back)."""
    for optimizer, options in (("ddp", ["--opt", "hook=fp16"]), ("decentralized-sgd", [])):
        mlbench("run", "task1a", "2", "--data-dir", str(cifar_small_dir), "--max-steps", "4", "--log-every",
                "2", "--optimizer", optimizer, *options, check=True)
        run = last_run()
        assert run.state == "finished" and run.division == "open" and run.optimizer == optimizer
        assert run_json(run)["changed"][:2] == [f"optimizer={optimizer}", "stop: --max-steps 4"]
        evs = events(run)
        for rank in (0, 1):
            sent = sum(e["value"] for e in evs if e["rank"] == rank and e["name"] == "comm/bytes")
            dense = sum(e["value"] for e in evs if e["rank"] == rank and e["name"] == "comm/dense_bytes")
            assert sent > 0 and dense == 4 * 4 * 272_474      # 2 (k-1)/k of 4 bytes per parameter
            assert {"time/communication", "time/backward"} <= {e["name"] for e in evs if e["rank"] == rank}
        details = mlbench("status", run.id, check=True).stdout
        assert "communication/compute" in details
        ratio = float(details.split("would have sent ")[1].split("x")[0])
        if optimizer == "ddp":      # fp16 halves the bytes; BatchNorm buffers are broadcast too
            assert 1.9 < ratio < 2.0
        else:                       # a 2-rank ring sends the model to one neighbour: as much as an all-reduce
            assert ratio == 1.0

"""`mlbench run ... --log-to TOOL:DIR` (issue 25, part 2): a run written into a tool while it
trains holds what `mlbench export` of the ended run writes, read back with the tool's own reader."""

from __future__ import annotations

import pytest

from tests.helpers import mlbench, run_ids

pytest.importorskip("tensorboard")


def test_a_run_logged_live_to_tensorboard_equals_its_export(tmp_path):
    from tests.results.test_export import read_tensorboard

    live, after = tmp_path / "live", tmp_path / "after"
    run = mlbench("run", "task2a", "2", "--data", "synthetic", "--max-steps", "4", "--log-every", "2",
                  "--log-to", f"tensorboard:{live}", check=True)
    run_id = run_ids()[0]
    assert f"Logged to tensorboard: {live / run_id}" in run.stdout
    mlbench("export", run_id, "--to", "tensorboard", str(after), check=True)
    live_series, live_last, live_hparams = read_tensorboard(live / run_id)
    series, last, hparams = read_tensorboard(after / run_id)
    assert live_series == series and live_last == last and live_hparams == hparams
    assert "rank1/time/communication" in series and "eval/accuracy" in series and "summary/steps" in series
    assert _note(live / run_id) == _note(after / run_id)
    assert "finished" in _note(live / run_id)


def _note(folder) -> str:
    from tensorboard.backend.event_processing.event_accumulator import TENSORS, EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    acc = EventAccumulator(str(folder), size_guidance={TENSORS: 0})
    acc.Reload()
    return make_ndarray(acc.Tensors("mlbench/run/text_summary")[0].tensor_proto).item().decode()


@pytest.mark.parametrize("args, says", [
    (("--detach", "--log-to", "tensorboard:tb"), "a detached run is followed by nobody"),
    (("--log-to", "tensorboard"), "--log-to tensorboard: give TOOL:DIR"),
    (("--log-to", "tensorbord:tb"), "unknown tool 'tensorbord'"),
])
def test_log_to_mistakes_are_one_line_and_start_nothing(args, says, tmp_path):
    proc = mlbench("run", "task2a", "2", "--data", "synthetic", "--max-steps", "2", *args)
    assert proc.returncode == 2 and says in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert run_ids() == []

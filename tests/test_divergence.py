"""A run whose training diverges (a non-finite loss) fails, naming the step and the rank.

Real workers (2 processes over gloo) train task 2a on a LIBSVM pair whose values are all finite,
also as float32, but so large that the first update overflows: the weights start at zero, so
step 1's loss is log 2 and its gradient about -0.25e20 on feature 1 (3/4 of the labels are
+1), which the rate of 2 workers (400) turns into a weight of about 1e22; step 2's margins,
1e22 x 1e20, are inf in float32 and the loss of every batch that holds a -1 label is inf.
Without the check the run went on and "finished" with whatever accuracy the broken model had.
"""

import json
import random
import re

from mlbench.results.store import RunStore
from tests.helpers import events, mlbench


def overflowing_pair(folder):
    folder.mkdir()
    rng = random.Random(0)
    for name, n in (("big", 400), ("big.t", 100)):
        labels = ["+1"] * (3 * n // 4) + ["-1"] * (n // 4)
        rng.shuffle(labels)
        (folder / name).write_text("".join(f"{y} 1:1e20 2:0.5\n" for y in labels))
    return folder


def test_a_loss_that_turns_inf_fails_the_run_naming_its_step_and_rank(tmp_path):
    data = overflowing_pair(tmp_path / "pair")
    proc = mlbench("run", "task2a", "2", "--data-dir", str(data), "--max-steps", "12", "--log-every", "5")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    (run,) = RunStore().list()
    assert run.state == "failed" and run.result is None
    # step 2 lies inside the first log interval (steps 1-5): the check names it, not the interval's end
    assert re.search(r"the training loss of rank [01] is inf at step 2 \(epoch 1\.00\); the run diverged",
                     run.reason), run.reason
    assert run.reason in proc.stderr.splitlines()[-1]
    recorded = events(run)
    errors = [e for e in recorded if e["name"] == "error"]
    assert errors and all(re.fullmatch(rf"the training loss of rank {e['rank']} is inf at step 2 .*", e["value"])
                          for e in errors)
    assert not [e for e in recorded if e["name"] in ("result", "train/loss", "eval/accuracy")]
    assert "NaN" not in json.dumps(recorded) and "Infinity" not in json.dumps(recorded)

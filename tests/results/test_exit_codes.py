"""`mlbench run`'s exit code says how the run ended: 0 goal reached (or no goal), 3 finished
without reaching its goal, 1 failed, 130 cancelled."""

from __future__ import annotations

import pytest

from mlbench.results.store import RunRecord
from tests.helpers import last_run, mlbench

MISSED = {"goal": 0.8, "reached": False, "stop_reason": "max-epochs"}


@pytest.mark.parametrize("state, result, missed", [
    ("finished", MISSED, True),
    ("finished", {**MISSED, "reached": True, "stop_reason": "goal"}, False),
    ("finished", {**MISSED, "reached": True, "stop_reason": "max-epochs"}, False),  # --no-stop
    ("finished", {**MISSED, "goal": None}, False),                 # synthetic data: no goal
    ("finished", {**MISSED, "stop_reason": "time-budget"}, False),  # accuracy after time
    ("finished", {**MISSED, "stop_reason": "max-steps"}, False),    # a quick check
    ("failed", None, False),
    ("finished", None, False),
])
def test_a_run_misses_its_goal_when_it_trained_to_the_end_without_reaching_it(state, result, missed):
    record = RunRecord(id="r", name="r", task="task1a", workers=1, state=state, division="closed",
                       result=result)
    assert record.missed_goal is missed


def test_a_run_that_misses_its_goal_exits_with_3(libsvm_dir):
    proc = mlbench("run", "task2a", "1", "--data-dir", str(libsvm_dir), "--set", "max_epochs=1",
                   "--set", "goal_full=0.9999")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "not reached" in proc.stdout and last_run().state == "finished"

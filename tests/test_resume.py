"""`mlbench run --checkpoint-every` and `mlbench resume RUN` with 2 real workers, through the CLI.

A run stopped by its step cap and resumed with a larger one ends with the very parameters
(torch.equal) of the same run uninterrupted, with PowerSGD (whose error feedback and Q
matrices each rank keeps); a run cancelled while it trains writes its checkpoint at the stop
and resumes from it; `status` shows the checkpoints and the resumes; a run that cannot resume
is refused in one line with exit 2.
"""

from __future__ import annotations

import json
import re

import torch

from mlbench.results.checkpoints import complete_checkpoints
from mlbench.results.store import RunStore
from tests.helpers import checkpoint, mlbench, run_json, wait_for

OPTIONS = ("--set", "batch_per_worker=50", "--optimizer", "powersgd", "--log-every", "1", "--save-model")


def _status(run_id: str) -> dict:
    return json.loads(mlbench("status", run_id, "-o", "json", check=True).stdout)


def _refused(*args: str) -> str:
    proc = mlbench(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    return proc.stderr


def test_a_run_stopped_by_its_step_cap_resumes_to_the_parameters_of_the_uninterrupted_run(libsvm_dir):
    RUN = ("task2a", "2", "--data-dir", str(libsvm_dir), *OPTIONS)
    mlbench("run", *RUN, "--max-steps", "3", "--checkpoint-every", "2steps", check=True)
    stopped = RunStore().list()[-1]
    status = _status(stopped.id)
    assert status["checkpoints"]["newest_step"] == 3 and status["checkpoints"]["count"] == 2
    assert status["checkpoints"]["every"] == "2 steps" and status["resumes"] == []

    _refused("resume", stopped.id)  # its own cap is the checkpoint's step
    proc = mlbench("resume", stopped.id, "--max-steps", "6", check=True)
    assert f"Resuming run {stopped.id}" in proc.stdout and "from step 3" in proc.stdout
    resumed = RunStore().get(stopped.id)
    assert resumed.state == "finished" and resumed.result["steps"] == 6
    document = run_json(resumed)
    assert [r["from_step"] for r in document["resumes"]] == [3]
    assert document["config"]["max_steps"] == 6 and document["config"]["resume_step"] == 3
    status = _status(stopped.id)
    assert status["checkpoints"]["newest_step"] == 6 and len(status["resumes"]) == 1
    table = mlbench("status", stopped.id, check=True).stdout
    assert "every 2 steps; newest at step 6 (2 kept)" in table and "1: from step 3 (after finished)" in table
    from mlbench.dashboard.views import run_spec  # the dashboard's run page: the same words
    from mlbench.results.events import read_run_events
    from mlbench.results.summary import summarize
    spec = run_spec(resumed, document, summarize(read_run_events(resumed.run_dir)))
    assert (spec["checkpoints"], spec["resumes"]) == ("every 2 steps; newest at step 6 (2 kept)",
                                                      "1: from step 3 (after finished)")

    mlbench("run", *RUN, "--max-steps", "6", check=True)
    reference = RunStore().list()[-1]
    for rank in range(2):
        expected, actual = checkpoint(reference, rank), checkpoint(resumed, rank)
        assert all(torch.equal(expected[name], actual[name]) for name in expected), rank

    assert "no complete checkpoint" in _refused("resume", reference.id)
    assert "no run" in _refused("resume", "nosuchrun").lower()


def test_a_cancelled_run_writes_its_checkpoint_at_the_stop_and_resumes_from_it(libsvm_dir):
    RUN = ("task2a", "2", "--data-dir", str(libsvm_dir), "--no-stop", "--set", "max_epochs=100000", *OPTIONS)
    proc = mlbench("run", *RUN, "--max-steps", "100000", "--checkpoint-every", "10m", "--detach")
    assert proc.returncode == 0, proc.stderr
    run = RunStore().list()[-1]
    wait_for(lambda: RunStore().get(run.id).state == "running" and _status(run.id)["summary"]["steps"] >= 2,
             120, "the run to train")
    assert "is running" in _refused("resume", run.id)
    mlbench("cancel", run.id, check=True)
    assert RunStore().get(run.id).state == "cancelled"
    newest = _status(run.id)["checkpoints"]["newest_step"]
    assert newest is not None and newest >= 2
    mlbench("resume", run.id, "--max-steps", str(newest + 2), check=True)
    final = RunStore().get(run.id)
    assert final.state == "finished" and final.result["steps"] == newest + 2
    assert run_json(final)["resumes"][0]["after"] == "cancelled"


def test_a_worker_killed_while_writing_a_checkpoint_does_not_block_the_resume(libsvm_dir):
    """SIGKILL mid-checkpoint leaves ``rank-R.pt.part`` in the step's folder (made here by hand:
    rank 0 wrote step 3's file, rank 1 died writing it); the resumed run writes step 3 again, which
    the partial file would refuse ("already exists") had resume not discarded the incomplete step."""
    RUN = ("task2a", "2", "--data-dir", str(libsvm_dir), "--set", "batch_per_worker=50", "--checkpoint-every", "2steps")
    mlbench("run", *RUN, "--max-steps", "2", check=True)
    run = RunStore().list()[-1]
    root = run.run_dir / "checkpoints"
    torn = root / "state-step-3"
    torn.mkdir()
    (torn / "rank-0.pt").write_bytes((root / "state-step-2" / "rank-0.pt").read_bytes())
    (torn / "rank-1.pt.part").write_bytes(b"half a checkpoint")

    proc = mlbench("resume", run.id, "--max-steps", "3")
    resumed = RunStore().get(run.id)
    assert proc.returncode == 0 and resumed.state == "finished", (resumed.reason, proc.stderr)
    assert resumed.result["steps"] == 3 and complete_checkpoints(root, 2).newest == 3
    assert sorted(p.name for p in torn.iterdir()) == ["manifest.json", "rank-0.pt", "rank-1.pt"]


def _steps_printed(output: str) -> list[int]:
    return [int(n) for n in re.findall(r"^  epoch +[\d.]+  step +(\d+)  loss", output, re.MULTILINE)]


def test_following_a_resumed_run_prints_only_what_came_after_the_resume():
    RUN = ("task2a", "2", "--data", "synthetic", "--set", "batch_per_worker=50", "--log-every", "1",
           "--checkpoint-every", "3steps")
    first = mlbench("run", *RUN, "--max-steps", "3", check=True).stdout
    assert _steps_printed(first) == [1, 2, 3], first
    run = RunStore().list()[-1]
    resumed = mlbench("resume", run.id, "--max-steps", "5", check=True).stdout
    assert _steps_printed(resumed) == [4, 5], resumed
    followed = mlbench("status", run.id, "--follow", check=True).stdout
    assert _steps_printed(followed) == [4, 5], followed
    assert _status(run.id)["summary"]["steps"] == 5   # status RUN: the whole run


def test_the_checkpoints_of_a_cluster_run_show_from_the_summary_its_supervisor_keeps(tmp_path):
    """A cluster run's checkpoints are on the cluster's volume, which the machine reading its run
    folder cannot list: its supervisor keeps their summary in the run folder (checkpoints.json),
    which status reads where the folder of the checkpoints is not there; where it is, the folder."""
    from mlbench.results.checkpoints import SUMMARY_FILE, summary

    run_dir = tmp_path / "runs" / "abc"
    run_dir.mkdir(parents=True)
    elsewhere = tmp_path / "volume" / "abc"
    kept = {"newest_step": 40, "count": 2, "folder": "/var/lib/mlbench/checkpoints/abc"}
    (run_dir / SUMMARY_FILE).write_text(json.dumps(kept))
    assert summary(run_dir, elsewhere, 2) == kept
    (elsewhere / "state-step-10").mkdir(parents=True)
    for rank in range(2):
        (elsewhere / "state-step-10" / f"rank-{rank}.pt").write_bytes(b"x")
    assert summary(run_dir, elsewhere, 2) == {"newest_step": 10, "count": 1, "folder": str(elsewhere)}
    (run_dir / SUMMARY_FILE).write_text("{torn")
    assert summary(run_dir, tmp_path / "absent", 2) == {"newest_step": None, "count": 0,
                                                         "folder": str(tmp_path / "absent")}


def test_a_run_killed_in_its_final_evaluation_resumes_to_its_result(libsvm_dir):
    """The newest checkpoint is the step cap's, written before the final evaluation; a kill
    there (made here by taking the run's result away, as the kill would have left it) leaves no
    result, and `resume` without a larger cap evaluates that checkpoint's model and finishes:
    the very accuracy the uninterrupted run reported."""
    RUN = ("task2a", "2", "--data-dir", str(libsvm_dir), "--set", "batch_per_worker=50", "--checkpoint-every", "2steps")
    mlbench("run", *RUN, "--max-steps", "6", check=True)
    store = RunStore()
    run = store.list()[-1]
    finished = run.result
    store.update(run.id, state="failed", result=None, reason="worker 0 was killed by SIGKILL")
    events_file = run.run_dir / "events" / "rank-0.jsonl"
    kept = [line for line in events_file.read_text().splitlines() if json.loads(line)["name"] != "result"]
    events_file.write_text("\n".join(kept) + "\n")

    proc = mlbench("resume", run.id)
    assert proc.returncode in (0, 3), proc.stdout + proc.stderr
    resumed = RunStore().get(run.id)
    assert resumed.state == "finished" and resumed.result["steps"] == 6
    assert (resumed.result["final_accuracy"], resumed.result["final_loss"]) == \
        (finished["final_accuracy"], finished["final_loss"])
    assert run_json(resumed)["resumes"][0]["from_step"] == 6

"""`POST /v1/runs/RUN/resume` (issue 24): a cluster run's folder and checkpoints are on the
results service's volume, so `mlbench resume` of it asks the service to make the run ready from
its newest complete checkpoint, over real HTTP to a real service process; what cannot resume is a
400 with the sentence the CLI prints. tests/kube resumes a run on the real node end to end."""

from __future__ import annotations

import json

from mlbench.results.checkpoints import rank_file
from tests.helpers import last_run, mlbench, run_json


def test_the_service_makes_an_ended_run_ready_from_its_newest_checkpoint_or_says_why_not(service):
    mlbench("run", "task2a", "2", "--data", "synthetic", "--checkpoint-every", "5steps", "--record-only",
            check=True)
    document = run_json(last_run())
    status, record = service.call("POST", "/v1/runs", {"task": "task2a", "workers": 2, "division": "open",
                                                       "launcher": "kubernetes", "run_json": document})
    assert status == 200, record
    run_id, run_dir = record["id"], service.home / "runs" / record["id"]
    assert service.call("POST", f"/v1/runs/{run_id}/resume", {})[1] == {
        "error": f"run {run_id} is pending: resume continues a run that stopped, failed or was cancelled"}
    assert service.call("POST", f"/v1/runs/{run_id}/cancel")[0] == 200
    assert service.call("POST", f"/v1/runs/{run_id}/resume", {}) == (400, {
        "error": f"run {run_id} has no complete checkpoint to resume from"})

    for step, ranks in ((5, (0, 1)), (10, (0, 1)), (15, (0,))):   # step 15: rank 1 was killed writing it
        for rank in ranks:
            path = rank_file(run_dir / "checkpoints", step, rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"state")
    assert service.call("POST", f"/v1/runs/{run_id}/resume", {"max_steps": "20"}) == (400, {
        "error": "max_steps must be a whole number of steps (0: no cap) or null"})
    assert service.call("POST", f"/v1/runs/{run_id}/resume", {"max_steps": 8}) == (400, {
        "error": f"run {run_id}'s newest valid checkpoint is at step 10, its step cap 8: give a larger --max-steps "
                 "(or --max-steps off)"})

    status, resumed = service.call("POST", f"/v1/runs/{run_id}/resume", {"max_steps": 30})
    assert status == 200 and resumed["state"] == "pending" and resumed["reason"] is None, resumed
    saved = json.loads((run_dir / "run.json").read_text())
    assert saved["config"]["resume_step"] == 10 and saved["config"]["max_steps"] == 30
    assert [(r["from_step"], r["after"], r["reason"]) for r in saved["resumes"]] == [
        (10, "cancelled", "cancelled by the user")]
    assert not (run_dir / "checkpoints" / "state-step-15").exists()   # the partial one, in the new start's way

"""`mlbench resume RUN` refuses a run whose run.json was edited since the run was created.

Each run is a real one-worker run of task2a on synthetic data that writes a checkpoint every 5
steps and stops at step 10. An edited batch size or task is refused in one line (exit 2) naming
what differs, with run.json, the catalog's record and the run folder as they were; the results
service's resume (a cluster run's) refuses it the same way; a legitimate `resume --max-steps`,
which rewrites the step cap, the checkpoint and the rendezvous in run.json, goes on and leaves
the frozen configuration as it was created; a run of a catalog from before configurations were
frozen resumes as before. The APIs this change added are imported inside the tests, so that each
test fails on the code before it by its assertion, not by an import error of the module.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

from mlbench.results.store import RunRecord, RunStore
from tests.helpers import mlbench, run_json

RUN = ("task2a", "1", "--data", "synthetic", "--checkpoint-every", "5steps", "--max-steps", "10")


def _stopped_run() -> RunRecord:
    mlbench("run", *RUN, check=True)
    run = RunStore().list()[-1]
    assert run.state == "finished" and run.result["steps"] == 10
    return run


def _edit(run: RunRecord, change) -> None:
    path = Path(run.run_dir) / "run.json"
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document, indent=2))


def _folder(run: RunRecord) -> dict[str, str]:
    """Every file of the run's folder and its SHA-256: what a refused resume must leave alone."""
    root = Path(run.run_dir)
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _refused(run: RunRecord, *args: str) -> str:
    before_folder, before_record = _folder(run), RunStore().get(run.id)
    proc = mlbench("resume", run.id, *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr
    assert _folder(run) == before_folder
    assert RunStore().get(run.id) == before_record   # still finished, its result and end kept
    return lines[0]


def test_a_run_json_with_an_edited_batch_size_is_refused_and_left_as_it_was():
    run = _stopped_run()
    _edit(run, lambda d: d["config"]["task"]["settings"].update(batch_per_worker=50))
    line = _refused(run, "--max-steps", "20")
    assert f"run {run.id}: run.json changed since the run was created " \
           "(config.task.settings.batch_per_worker 100 -> 50); resume continues the run as it was recorded" in line
    assert run_json(run)["config"]["task"]["settings"]["batch_per_worker"] == 50
    assert "resumes" not in run_json(run) and run_json(run)["config"]["resume_step"] is None

    # a cluster run's resume is the results service's (POST /v1/runs/RUN/resume): the same refusal
    from mlbench.server.service import HttpError, ResultsService
    service = ResultsService(RunStore().home, "worker-secret", "admin-secret")
    before = _folder(run)
    with pytest.raises(HttpError) as refused:
        service.resume(service.run(run.id), {"max_steps": 20})
    assert refused.value.status == 400 and "batch_per_worker 100 -> 50" in str(refused.value)
    assert _folder(run) == before and RunStore().get(run.id).state == "finished"


def test_a_run_json_with_an_edited_task_is_refused():
    run = _stopped_run()

    def other_task(document: dict) -> None:
        document["task"] = "task1a"
        document["config"]["task"]["name"] = "task1a"

    _edit(run, other_task)
    line = _refused(run, "--max-steps", "20")
    assert "(task task2a -> task1a; config.task.name task2a -> task1a)" in line
    assert run_json(run)["task"] == "task1a"


def test_a_legitimate_resume_goes_on_and_the_run_stays_frozen_as_created():
    run = _stopped_run()
    proc = mlbench("resume", run.id, "--max-steps", "20", check=True)
    assert f"Resuming run {run.id}" in proc.stdout and "from step 10" in proc.stdout
    resumed = RunStore().get(run.id)
    assert resumed.state == "finished" and resumed.result["steps"] == 20
    document = run_json(resumed)
    assert (document["config"]["max_steps"], document["config"]["resume_step"]) == (20, 10)
    frozen = RunStore().frozen(run.id)
    assert frozen["config"]["max_steps"] == 10 and frozen["config"]["resume_step"] is None
    assert frozen["config"]["task"] == document["config"]["task"]

    # what that resume rewrote opens no way around the check
    _edit(run, lambda d: d["config"].update(optimizer="local-sgd"))
    line = _refused(run, "--max-steps", "30")
    assert "(config.optimizer centralized-sgd -> local-sgd)" in line


def test_a_run_of_a_catalog_from_before_frozen_configurations_resumes_as_before():
    run = _stopped_run()
    home = RunStore().home
    with sqlite3.connect(home / "runs.db") as db:   # the catalog as the release before kept it
        db.execute("DROP TABLE IF EXISTS frozen_runs")
        db.execute("PRAGMA user_version = 1")
    proc = mlbench("resume", run.id, "--max-steps", "15", check=True)
    assert "from step 10" in proc.stdout
    resumed = RunStore().get(run.id)
    assert resumed.state == "finished" and resumed.result["steps"] == 15
    from mlbench.results.catalog import SCHEMA_VERSION
    with sqlite3.connect(home / "runs.db") as db:   # migrated on opening: a table, no row for it
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
        assert db.execute("SELECT COUNT(*) FROM frozen_runs").fetchone()[0] == 0
    assert RunStore().frozen(run.id) is None


def test_the_workers_of_a_shrunk_group_are_no_edit_but_other_sizes_are():
    """``--on-failure shrink`` rewrites config.workers to the survivors' count and records the
    shrink in ``faults.restarts``; only that count is taken for the run as created."""
    from mlbench.launch.run_folder import changes_since_created
    frozen = {"task": "task2a", "config": {**_new_config(), "workers": 3}}
    shrunk = json.loads(json.dumps(frozen))
    shrunk["config"].update(workers=2, resume_step=4, master_port=41234, max_steps=None)
    shrunk["faults"] = {"restarts": [{"from_step": 4, "workers": 2, "survivors": [0, 2]}]}
    assert changes_since_created(frozen, shrunk) == []
    shrunk["config"]["workers"] = 1
    assert changes_since_created(frozen, shrunk) == ["config.workers 2 -> 1"]
    del shrunk["faults"]
    shrunk["config"]["workers"] = 2
    assert changes_since_created(frozen, shrunk) == ["config.workers 3 -> 2"]


def _new_config() -> dict:
    """The ``config`` of a task2a run as a new run records it (no run started)."""
    from mlbench.run_config import RunConfig
    from mlbench.tasks.registry import get_task
    return RunConfig(task=get_task("task2a"), workers=1, data="synthetic").to_dict()


def test_two_resumes_of_one_run_at_once_are_one_resume_and_one_refusal_that_changes_nothing():
    """Issue 57, item 2: both resumes read the run as ended; the resume lock lets one edit
    run.json and reopen the run, and the other, which then sees it pending or running, is
    refused in one line without writing its step cap."""
    import subprocess
    import sys

    run = _stopped_run()
    procs = [subprocess.Popen([sys.executable, "-m", "mlbench", "resume", run.id, "--max-steps", str(cap)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for cap in (20, 30)]
    outcomes = [(p.wait(timeout=240), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in outcomes)
    assert codes == [0, 2], outcomes
    refusal = next(err for code, err in outcomes if code == 2).strip().splitlines()
    assert len(refusal) == 1 and "resume continues a run that stopped, failed or was cancelled" in refusal[0]
    document = run_json(RunStore().get(run.id))
    assert len(document["resumes"]) == 1
    won = document["resumes"][0]["max_steps"]
    assert document["config"]["max_steps"] == won and RunStore().get(run.id).result["steps"] == won
